//! The lexical similarity stage: Okapi BM25 over tool and domain texts, with a small
//! suffix-stripping stemmer and an English stopword list.
//!
//! The index is built once per router; a registry change builds a new router. Scoring
//! a message touches only the postings of its own terms.

use std::collections::HashMap;

/// BM25 term-frequency saturation.
const K1: f32 = 1.2;
/// BM25 length normalisation.
const B: f32 = 0.75;

/// Function words and chat filler that say nothing about which tool is meant.
const STOPWORDS: &[&str] = &[
    "a",
    "about",
    "above",
    "actually",
    "after",
    "again",
    "all",
    "also",
    "am",
    "an",
    "and",
    "any",
    "anything",
    "are",
    "as",
    "at",
    "be",
    "been",
    "before",
    "being",
    "btw",
    "but",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "doing",
    "don",
    "done",
    "each",
    "even",
    "ever",
    "for",
    "from",
    "get",
    "give",
    "go",
    "going",
    "got",
    "had",
    "has",
    "have",
    "he",
    "her",
    "here",
    "hers",
    "him",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "itself",
    "just",
    "know",
    "let",
    "like",
    "ll",
    "lol",
    "me",
    "mine",
    "more",
    "most",
    "much",
    "my",
    "need",
    "no",
    "nor",
    "not",
    "now",
    "of",
    "off",
    "ok",
    "okay",
    "on",
    "once",
    "one",
    "only",
    "or",
    "other",
    "our",
    "ours",
    "out",
    "over",
    "please",
    "pls",
    "re",
    "really",
    "right",
    "s",
    "same",
    "she",
    "should",
    "so",
    "some",
    "something",
    "still",
    "such",
    "t",
    "than",
    "thank",
    "thanks",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "these",
    "they",
    "thing",
    "this",
    "those",
    "through",
    "to",
    "too",
    "up",
    "us",
    "use",
    "used",
    "uses",
    "using",
    "ve",
    "very",
    "want",
    "was",
    "we",
    "were",
    "what",
    "whats",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "would",
    "yeah",
    "yes",
    "you",
    "your",
    "yours",
];

pub(crate) fn is_stopword(word: &str) -> bool {
    STOPWORDS.binary_search(&word).is_ok()
}

/// Strips common English inflections so `containers`, `container` and `containerized`
/// share a stem often enough to matter. Deliberately light: over-stemming merges words
/// that route to different tools. Only ever truncates, so the stem borrows the word.
pub(crate) fn stem(word: &str) -> &str {
    if !word.is_ascii() || word.len() <= 3 {
        return word;
    }
    let stripped = strip_suffix(word);
    // `update`/`updat(ing)`, `entry`/`entr(ies)`: drop the final `e`, and a `y` after a
    // consonant, so both spellings meet.
    let bytes = stripped.as_bytes();
    match bytes {
        [.., prev, b'e'] if bytes.len() >= 4 && !matches!(prev, b'e') => {
            &stripped[..bytes.len() - 1]
        }
        [.., prev, b'y'] if bytes.len() >= 4 && !is_vowel(*prev) => &stripped[..bytes.len() - 1],
        _ => stripped,
    }
}

fn is_vowel(b: u8) -> bool {
    matches!(b, b'a' | b'e' | b'i' | b'o' | b'u')
}

fn strip_suffix(word: &str) -> &str {
    for (suffix, min_stem) in [
        ("ization", 4),
        ("ation", 4),
        ("ments", 4),
        ("ment", 4),
        ("ness", 4),
        ("ing", 3),
        ("ies", 3),
        ("ied", 3),
        ("ers", 3),
        ("er", 3),
        ("ed", 3),
        ("es", 3),
        ("ly", 4),
        ("s", 3),
    ] {
        let Some(stem) = word.strip_suffix(suffix) else {
            continue;
        };
        if stem.len() < min_stem {
            continue;
        }
        let last = stem.as_bytes()[stem.len() - 1];
        match suffix {
            // `class`, `status`, `analysis`: the final `s` is part of the word.
            "s" if matches!(last, b's' | b'u' | b'i') => return word,
            // `es` only ends plurals after sibilants (`boxes`, `switches`); `images` is
            // `image` + `s`.
            "es" if !(matches!(last, b's' | b'x' | b'z')
                || stem.ends_with("ch")
                || stem.ends_with("sh")) =>
            {
                continue;
            }
            // `speed`, `need`: not a past tense.
            "ed" if last == b'e' => return word,
            _ => {}
        }
        // `running` → `run`, `stopped` → `stop`.
        let bytes = stem.as_bytes();
        if matches!(suffix, "ing" | "ed" | "er" | "ers")
            && bytes.len() >= 3
            && bytes[bytes.len() - 1] == bytes[bytes.len() - 2]
            && !matches!(bytes[bytes.len() - 1], b'l' | b's' | b'z' | b'e' | b'o')
        {
            return &stem[..stem.len() - 1];
        }
        return stem;
    }
    word
}

/// Hangul, kana and CJK ideographs: scripts written without spaces between words,
/// or (Korean) with particles and endings attached to them.
fn is_cjk(c: char) -> bool {
    matches!(c,
        '\u{AC00}'..='\u{D7A3}' | '\u{1100}'..='\u{11FF}' | '\u{3130}'..='\u{318F}'
        | '\u{3040}'..='\u{30FF}' | '\u{3400}'..='\u{4DBF}' | '\u{4E00}'..='\u{9FFF}'
        | '\u{F900}'..='\u{FAFF}')
}

/// Calls `emit` for each index term of `text`: lowercase words split on anything that
/// is not a letter or digit, stopwords dropped, ASCII words stemmed. Chinese, Japanese
/// and Korean words yield their overlapping two-character windows instead, as Lucene's
/// CJK analyzer does: Korean attaches particles and endings to the word (`일정이`,
/// `일정을` both contain `일정`), and Chinese and Japanese put no space between words.
pub(crate) fn for_each_term(text: &str, mut emit: impl FnMut(&str)) {
    let mut word = String::new();
    let mut flush = |word: &mut String| {
        if word.is_empty() {
            return;
        }
        if word.is_ascii() {
            if word.len() >= 2 && !is_stopword(word) {
                emit(stem(word));
            }
        } else if word.chars().any(is_cjk) {
            let chars: Vec<char> = word.chars().collect();
            if chars.len() <= 2 {
                emit(word);
            } else {
                let mut window = String::new();
                for pair in chars.windows(2) {
                    window.clear();
                    window.extend(pair);
                    emit(&window);
                }
            }
        } else {
            emit(word);
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_alphanumeric() {
            word.extend(c.to_lowercase());
        } else {
            flush(&mut word);
        }
    }
    flush(&mut word);
}

/// The terms of `text` (see [`for_each_term`]), each followed by a line break, into
/// `words` (cleared first). Terms never contain one.
pub(crate) fn query_words(text: &str, words: &mut String) {
    words.clear();
    for_each_term(text, |term| {
        words.push_str(term);
        words.push('\n');
    });
    words.pop();
}

/// One field of a document and how much its terms count.
pub(crate) struct Field<'a> {
    pub text: &'a str,
    pub weight: f32,
}

/// An inverted BM25 index over a fixed set of documents.
pub(crate) struct Bm25Index {
    term_ids: HashMap<String, u32>,
    /// Per term: (document, weighted term frequency).
    postings: Vec<Vec<(u32, f32)>>,
    idf: Vec<f32>,
    /// Per document: `K1 * (1 - B + B * len / avg_len)`, the length part of BM25.
    length_norm: Vec<f32>,
}

impl Bm25Index {
    /// Indexes `documents`; each is a list of weighted fields.
    pub(crate) fn new(documents: &[Vec<Field<'_>>]) -> Self {
        let mut term_ids: HashMap<String, u32> = HashMap::new();
        let mut postings: Vec<Vec<(u32, f32)>> = Vec::new();
        let mut doc_lens = Vec::with_capacity(documents.len());
        let mut term_freqs: HashMap<u32, f32> = HashMap::new();
        for (doc_idx, fields) in documents.iter().enumerate() {
            term_freqs.clear();
            let mut doc_len = 0.0f32;
            for field in fields {
                for_each_term(field.text, |term| {
                    let next_id = term_ids.len() as u32;
                    let id = *term_ids.entry(term.to_owned()).or_insert(next_id);
                    if id as usize == postings.len() {
                        postings.push(Vec::new());
                    }
                    *term_freqs.entry(id).or_insert(0.0) += field.weight;
                    doc_len += field.weight;
                });
            }
            let mut sorted: Vec<(u32, f32)> = term_freqs.iter().map(|(&t, &f)| (t, f)).collect();
            sorted.sort_by_key(|&(t, _)| t);
            for (term, freq) in sorted {
                postings[term as usize].push((doc_idx as u32, freq));
            }
            doc_lens.push(doc_len);
        }
        let n_docs = documents.len().max(1) as f32;
        let avg_len = (doc_lens.iter().sum::<f32>() / n_docs).max(1.0);
        let idf = postings
            .iter()
            .map(|docs| {
                let df = docs.len() as f32;
                ((n_docs - df + 0.5) / (df + 0.5) + 1.0).ln()
            })
            .collect();
        let length_norm = doc_lens
            .iter()
            .map(|&len| K1 * (1.0 - B + B * len / avg_len))
            .collect();
        Bm25Index {
            term_ids,
            postings,
            idf,
            length_norm,
        }
    }

    #[cfg(test)]
    pub(crate) fn n_docs(&self) -> usize {
        self.length_norm.len()
    }

    /// Distinct index terms of `query`, in first-seen order.
    #[cfg(test)]
    pub(crate) fn query_terms(&self, query: &str, terms: &mut Vec<u32>) {
        let mut words = String::new();
        query_words(query, &mut words);
        self.query_word_terms(&words, terms);
    }

    /// [`Bm25Index::query_terms`] for words already cut by [`query_words`]: one cut
    /// serves several indexes.
    pub(crate) fn query_word_terms(&self, words: &str, terms: &mut Vec<u32>) {
        terms.clear();
        for term in words.split('\n') {
            if let Some(&id) = self.term_ids.get(term)
                && !terms.contains(&id)
            {
                terms.push(id);
            }
        }
    }

    /// Adds each document's BM25 score for `terms` into `scores` (one slot per document).
    pub(crate) fn score_into(&self, terms: &[u32], scores: &mut [f32]) {
        self.accumulate(terms, scores, |_| {});
    }

    /// [`Bm25Index::score_into`], also listing in `touched` each document whose slot
    /// was zero when a term reached it: the documents the query touched, so that a
    /// caller can go over them instead of every document. (A slot listed twice, which
    /// takes a term adding exactly zero, is harmless to scale or reset.)
    pub(crate) fn score_into_touched(
        &self,
        terms: &[u32],
        scores: &mut [f32],
        touched: &mut Vec<u32>,
    ) {
        self.accumulate(terms, scores, |doc| touched.push(doc));
    }

    fn accumulate(&self, terms: &[u32], scores: &mut [f32], mut first_touch: impl FnMut(u32)) {
        for &term in terms {
            let (Some(docs), Some(&idf)) = (
                self.postings.get(term as usize),
                self.idf.get(term as usize),
            ) else {
                continue;
            };
            for &(doc, freq) in docs {
                let (Some(slot), Some(&norm)) = (
                    scores.get_mut(doc as usize),
                    self.length_norm.get(doc as usize),
                ) else {
                    continue;
                };
                if *slot == 0.0 {
                    first_touch(doc);
                }
                *slot += idf * freq * (K1 + 1.0) / (freq + norm);
            }
        }
    }

    /// What one occurrence of `term` adds to a document of average length.
    pub(crate) fn idf(&self, term: u32) -> f32 {
        self.idf.get(term as usize).copied().unwrap_or(0.0)
    }

    /// The largest score one term can add to a document: used to squash raw scores
    /// into 0..1 in a way that does not depend on the other documents.
    pub(crate) fn max_term_score(&self, term: u32) -> f32 {
        self.idf.get(term as usize).copied().unwrap_or(0.0) * (K1 + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopwords_are_sorted_for_binary_search() {
        assert!(
            STOPWORDS.windows(2).all(|w| w[0] < w[1]),
            "keep STOPWORDS sorted"
        );
        assert!(is_stopword("the"));
        assert!(!is_stopword("weather"));
    }

    #[test]
    fn stemmer_folds_common_inflections() {
        assert_eq!(stem("containers"), stem("container"));
        assert_eq!(stem("images"), stem("image"));
        assert_eq!(stem("restarting"), stem("restart"));
        assert_eq!(stem("stopped"), stem("stop"));
        assert_eq!(stem("running"), "run");
        assert_eq!(stem("switches"), "switch");
        assert_eq!(stem("entries"), stem("entry"));
        assert_eq!(stem("queries"), stem("query"));
        assert_eq!(stem("speeds"), stem("speed"));
        assert_eq!(stem("updating"), stem("update"));
        assert_eq!(stem("status"), "status");
        assert_eq!(stem("address"), "address");
    }

    #[test]
    fn hangul_words_yield_two_character_windows() {
        let mut terms = Vec::new();
        for_each_term("일정이 뭐", |t| terms.push(t.to_owned()));
        assert_eq!(terms, vec!["일정", "정이", "뭐"]);
    }

    #[test]
    fn chinese_and_japanese_words_yield_two_character_windows() {
        let mut terms = Vec::new();
        for_each_term("天气预报 てんき", |t| terms.push(t.to_owned()));
        assert_eq!(terms, vec!["天气", "气预", "预报", "てん", "んき"]);
    }

    #[test]
    fn bm25_ranks_the_document_that_shares_rare_terms() {
        let docs = vec![
            vec![Field {
                text: "get current weather forecast",
                weight: 1.0,
            }],
            vec![Field {
                text: "list running containers",
                weight: 1.0,
            }],
            vec![Field {
                text: "stop a running container",
                weight: 1.0,
            }],
        ];
        let index = Bm25Index::new(&docs);
        let mut terms = Vec::new();
        index.query_terms("stop the redis container", &mut terms);
        let mut scores = vec![0.0; index.n_docs()];
        index.score_into(&terms, &mut scores);
        assert!(scores[2] > scores[1] && scores[1] > scores[0], "{scores:?}");
        assert_eq!(scores[0], 0.0);
    }
}
