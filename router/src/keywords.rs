//! The keyword stage: one Aho-Corasick pass over the message for the keywords of
//! every domain and tool.
//!
//! # Matching rule
//!
//! Patterns and the message are both lowercased with [`str::to_lowercase`] before the
//! automaton is built or run, so matching is case-insensitive for every script, not only
//! ASCII. The automaton reports overlapping matches, so `light` and `lights` (or
//! `turn on` and `on`) are all seen.
//!
//! A keyword made only of ASCII characters must sit on word boundaries:
//!
//! - **start**: if the keyword begins with a letter or digit, the character before it
//!   must not be a letter or digit. `light` does not fire in `highlight` or
//!   `delightful`, `rain` does not fire in `train`.
//! - **end**: if the keyword ends with a letter or digit, the character after it must not
//!   be a letter or digit, unless the letters that follow, up to the next non-letter,
//!   are a short inflection (`s`, `es`, `ed`, `d`, `ing`, `er`, `ers`). `light` fires on
//!   `lights`, `stream` on `streaming`, `backup` on `backups`; `file` does not fire in
//!   `filesystem`.
//!
//! Keywords that begin or end with punctuation (`.txt`, `.local`) skip the check on that
//! side: the punctuation is already a boundary.
//!
//! A keyword with any non-ASCII character (Korean `날씨`, `일정`) matches as a plain
//! substring: Korean attaches particles to the word (`날씨는`, `일정이`), so a boundary
//! rule would miss most real uses.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// What a keyword belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeywordOwner {
    Domain(usize),
    Tool(usize),
}

/// Every keyword of every domain and tool, compiled into one automaton.
pub(crate) struct KeywordIndex {
    automaton: Option<AhoCorasick>,
    /// Per pattern id: whether the boundary rule applies (the keyword is ASCII).
    pattern_is_ascii: Vec<bool>,
    /// Per pattern id: the owners that declared it (one keyword may be declared by
    /// several domains).
    owners_by_pattern: Vec<Vec<KeywordOwner>>,
    /// Per pattern id: the keyword, lowercased, so that a reason can name it.
    patterns: Vec<String>,
}

/// Inflections an ASCII keyword may be followed by and still match.
const INFLECTION_SUFFIXES: &[&str] = &["s", "es", "ed", "d", "ing", "er", "ers"];

impl KeywordIndex {
    /// Builds the automaton. Empty and duplicate keywords are folded away.
    pub(crate) fn new<'a>(keywords: impl IntoIterator<Item = (&'a str, KeywordOwner)>) -> Self {
        let mut patterns: Vec<String> = Vec::new();
        let mut owners_by_pattern: Vec<Vec<KeywordOwner>> = Vec::new();
        let mut pattern_ids = std::collections::HashMap::<String, usize>::new();
        for (keyword, owner) in keywords {
            let pattern = keyword.trim().to_lowercase();
            if pattern.is_empty() {
                continue;
            }
            let id = *pattern_ids.entry(pattern.clone()).or_insert_with(|| {
                patterns.push(pattern);
                owners_by_pattern.push(Vec::new());
                owners_by_pattern.len() - 1
            });
            if !owners_by_pattern[id].contains(&owner) {
                owners_by_pattern[id].push(owner);
            }
        }
        let pattern_is_ascii = patterns.iter().map(|p| p.is_ascii()).collect();
        // Building only fails past size limits far beyond any catalog; a router without
        // keywords still routes by similarity, so degrade instead of failing.
        let automaton = if patterns.is_empty() {
            None
        } else {
            AhoCorasickBuilder::new()
                .match_kind(MatchKind::Standard)
                .build(&patterns)
                .ok()
        };
        KeywordIndex {
            automaton,
            pattern_is_ascii,
            owners_by_pattern,
            patterns,
        }
    }

    /// The keyword of a pattern id passed to `for_each_match`.
    pub(crate) fn pattern(&self, id: u32) -> &str {
        self.patterns.get(id as usize).map_or("", String::as_str)
    }

    /// Number of distinct keywords compiled in.
    pub(crate) fn n_patterns(&self) -> usize {
        self.owners_by_pattern.len()
    }

    /// Calls `on_match` once per (keyword, owner) occurrence in `lowercased_message`,
    /// which must already be lowercased with [`str::to_lowercase`], with the keyword's
    /// pattern id (see [`KeywordIndex::pattern`]).
    pub(crate) fn for_each_match(
        &self,
        lowercased_message: &str,
        mut on_match: impl FnMut(KeywordOwner, u32),
    ) {
        let Some(automaton) = &self.automaton else {
            return;
        };
        for found in automaton.find_overlapping_iter(lowercased_message) {
            let pattern_idx = found.pattern().as_usize();
            let is_ascii = self
                .pattern_is_ascii
                .get(pattern_idx)
                .copied()
                .unwrap_or(false);
            if is_ascii && !on_word_boundaries(lowercased_message, found.start(), found.end()) {
                continue;
            }
            if let Some(owners) = self.owners_by_pattern.get(pattern_idx) {
                for &owner in owners {
                    on_match(owner, pattern_idx as u32);
                }
            }
        }
    }
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric()
}

/// The ASCII boundary rule of the module docs, for the match `text[start..end]`.
pub(crate) fn on_word_boundaries(text: &str, start: usize, end: usize) -> bool {
    let Some(matched) = text.get(start..end) else {
        return false;
    };
    let starts_with_word = matched.chars().next().is_some_and(is_word_char);
    let ends_with_word = matched.chars().next_back().is_some_and(is_word_char);
    if starts_with_word && text[..start].chars().next_back().is_some_and(is_word_char) {
        return false;
    }
    if !ends_with_word {
        return true;
    }
    let rest = &text[end..];
    let trailing_letters = rest
        .char_indices()
        .find(|&(_, c)| !is_word_char(c))
        .map_or(rest, |(i, _)| &rest[..i]);
    trailing_letters.is_empty() || INFLECTION_SUFFIXES.contains(&trailing_letters)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(keyword: &str, message: &str) -> bool {
        let index = KeywordIndex::new([(keyword, KeywordOwner::Domain(0))]);
        let mut hit = false;
        index.for_each_match(&message.to_lowercase(), |_, _| hit = true);
        hit
    }

    #[test]
    fn ascii_keywords_respect_word_boundaries() {
        assert!(matches("light", "turn on the porch light"));
        assert!(matches("light", "dim the lights"));
        assert!(matches("light", "Light it up"));
        assert!(!matches("light", "give me the highlights of the game"));
        assert!(!matches("light", "a delightful evening"));
        assert!(!matches("rain", "whens my train on friday"));
        assert!(!matches("file", "the filesystem is full"));
        assert!(matches("stream", "who is streaming"));
        assert!(matches("backup", "list my backups"));
        assert!(matches("turn on", "please turn on the fan"));
        assert!(!matches("app", "fill the application form"));
    }

    #[test]
    fn punctuation_edges_need_no_boundary() {
        assert!(matches(".local", "what ip does octopi.local have"));
        assert!(matches(".txt", "open notes.txt"));
        assert!(matches("e-mail", "send an e-mail"));
    }

    #[test]
    fn korean_keywords_match_as_substrings() {
        assert!(matches("날씨", "부산 지금 날씨 어때"));
        assert!(matches("날씨", "날씨는 어때?"));
        assert!(matches("일정", "내일 오후 일정이 뭐 있어?"));
        assert!(!matches("날씨", "내일 서울 비 와?"));
    }

    #[test]
    fn matching_is_case_insensitive_beyond_ascii() {
        assert!(matches("Docker", "DOCKER PS"));
        assert!(matches(
            "straße",
            "STRASSE".to_lowercase().replace("ss", "ß").as_str()
        ));
    }

    #[test]
    fn every_owner_of_a_shared_keyword_is_reported() {
        let index = KeywordIndex::new([
            ("schedule", KeywordOwner::Domain(0)),
            ("schedule", KeywordOwner::Domain(1)),
            ("", KeywordOwner::Domain(2)),
        ]);
        assert_eq!(index.n_patterns(), 1);
        let mut owners = Vec::new();
        index.for_each_match("schedule a backup", |o, _| owners.push(o));
        assert_eq!(
            owners,
            vec![KeywordOwner::Domain(0), KeywordOwner::Domain(1)]
        );
    }
}
