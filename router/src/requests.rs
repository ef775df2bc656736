//! Splitting a message into the requests it chains.
//!
//! "check the weather in Busan and put a dentist appointment on friday" asks two
//! things. Scored as one text, the stronger request hides the weaker one (BM25's
//! relative threshold, and one averaged vector for the dense stage), so the router also
//! scores each request on its own and keeps, per tool and per domain, the best score.
//!
//! Boundaries: sentence punctuation followed by a space or the end (`.` inside `1.5` or
//! `example.com` is not one), `;`, line breaks, the connectives `and then`, `then`,
//! `also`, `plus`, `after that`, and `and` when both sides have at least
//! [`MIN_WORDS_AROUND_AND`] words (so `rent and size` stays together); Korean
//! `그리고`/`그다음`/`또` as words, and a word ending in `하고`/`해주고`/`고서` ends a request
//! (`날씨 확인하고 일정 잡아줘`).

use std::borrow::Cow;

/// Most requests scored per message; the rest of the message stays in the last one.
pub(crate) const MAX_REQUESTS: usize = 6;

/// `X and Y` splits only when X and Y each have at least this many words.
const MIN_WORDS_AROUND_AND: usize = 3;

/// English connectives that start a new request; matched as whole words,
/// case-insensitively. Longest first.
const CONNECTIVES: &[&[&str]] = &[
    &["and", "then"],
    &["after", "that"],
    &["and", "also"],
    &["then"],
    &["also"],
    &["plus"],
];

/// Korean words that start a new request.
const KOREAN_CONNECTIVES: &[&str] = &["그리고", "그다음", "그다음에", "그리고나서", "또"];

/// Korean word endings that close a request (`확인하고`, `찾아주고`).
const KOREAN_CLOSING_ENDINGS: &[&str] = &["하고", "해주고", "주고", "고서"];

/// The requests of `message`, in order. A message with one request gives one piece
/// (trimmed); pieces with no letter or digit are dropped.
pub(crate) fn split_requests(message: &str) -> Vec<&str> {
    let mut pieces: Vec<&str> = Vec::new();
    if !may_chain(message) {
        // Most messages ask one thing: skip cutting them into words.
        push_trimmed(&mut pieces, message);
        pieces.retain(|p| p.chars().any(char::is_alphanumeric));
        return pieces;
    }
    split_each(message, pieces)
}

/// [`split_requests`] without the shortcut for messages that cannot chain.
fn split_each<'a>(message: &'a str, mut pieces: Vec<&'a str>) -> Vec<&'a str> {
    for sentence in split_sentences(message) {
        split_connectives(sentence, &mut pieces);
    }
    pieces.retain(|p| p.chars().any(char::is_alphanumeric));
    if pieces.len() > MAX_REQUESTS {
        // Keep the first requests separate and fold the tail into one piece: its
        // bytes run from the start of piece MAX_REQUESTS-1 to the end of the message.
        let tail_start = offset_in(message, pieces[MAX_REQUESTS - 1]);
        let tail_end =
            offset_in(message, pieces[pieces.len() - 1]) + pieces[pieces.len() - 1].len();
        pieces.truncate(MAX_REQUESTS - 1);
        if let Some(tail) = message.get(tail_start..tail_end) {
            pieces.push(tail.trim());
        }
    }
    pieces
}

/// Whether `message` has anything a request boundary is made of: sentence
/// punctuation, a line break, a non-ASCII character (Korean connectives and endings)
/// or the letters of an English connective or `and`. `false` means one request.
fn may_chain(message: &str) -> bool {
    const MARKS: &[u8] = b";.!?\n\r";
    const LETTERS: &[&[u8]] = &[b"and", b"then", b"after", b"also", b"plus"];
    let bytes = message.as_bytes();
    !message.is_ascii()
        || bytes.iter().any(|b| MARKS.contains(b))
        || LETTERS.iter().any(|pattern| {
            bytes
                .windows(pattern.len())
                .any(|w| w.eq_ignore_ascii_case(pattern))
        })
}

/// Byte offset of `piece`, a subslice of `message`.
fn offset_in(message: &str, piece: &str) -> usize {
    (piece.as_ptr() as usize).saturating_sub(message.as_ptr() as usize)
}

/// Cuts at `.`/`!`/`?`/`。` followed by whitespace or the end, at `;` and at line breaks.
fn split_sentences(message: &str) -> Vec<&str> {
    let mut sentences = Vec::new();
    let mut start = 0;
    let mut chars = message.char_indices().peekable();
    while let Some((idx, c)) = chars.next() {
        let next_is_space_or_end = chars.peek().is_none_or(|&(_, n)| n.is_whitespace());
        let boundary = match c {
            ';' | '\n' | '\r' | '。' => true,
            '.' | '!' | '?' => next_is_space_or_end,
            _ => false,
        };
        if boundary {
            push_trimmed(&mut sentences, &message[start..idx]);
            start = idx + c.len_utf8();
        }
    }
    push_trimmed(&mut sentences, &message[start..]);
    sentences
}

fn push_trimmed<'a>(pieces: &mut Vec<&'a str>, piece: &'a str) {
    let piece = piece.trim_matches(|c: char| c.is_whitespace() || c == ',');
    if !piece.is_empty() {
        pieces.push(piece);
    }
}

/// Splits one sentence at connectives and pushes the pieces.
fn split_connectives<'a>(sentence: &'a str, pieces: &mut Vec<&'a str>) {
    // Words with their byte spans.
    let words: Vec<(usize, &str)> = word_spans(sentence);
    let lower: Vec<Cow<'_, str>> = words
        .iter()
        .map(|(_, w)| {
            let word = w.trim_matches(|c: char| !c.is_alphanumeric());
            if word
                .bytes()
                .any(|b| !b.is_ascii_lowercase() && !b.is_ascii_digit())
            {
                Cow::Owned(word.to_lowercase())
            } else {
                Cow::Borrowed(word)
            }
        })
        .collect();
    // Cut points: (byte where the piece before ends, byte where the next starts).
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let mut matched = 0;
        for connective in CONNECTIVES {
            if lower[i..].len() >= connective.len()
                && connective.iter().zip(&lower[i..]).all(|(p, w)| p == w)
            {
                matched = connective.len();
                break;
            }
        }
        if matched == 0 && KOREAN_CONNECTIVES.contains(&lower[i].as_ref()) {
            matched = 1;
        }
        if matched == 0 && lower[i] == "and" {
            let before = i - cuts_last_word(&cuts, &words);
            let after = words.len() - i - 1;
            // Count words after up to the next connective: approximate with the rest.
            if before >= MIN_WORDS_AROUND_AND && after >= MIN_WORDS_AROUND_AND {
                matched = 1;
            }
        }
        if matched > 0 {
            let (start, _) = words[i];
            let end_word = &words[i + matched - 1];
            cuts.push((start, end_word.0 + end_word.1.len()));
            i += matched;
            continue;
        }
        if matched == 0
            && i + 1 < words.len()
            && lower[i].chars().count() > 2
            && KOREAN_CLOSING_ENDINGS.iter().any(|e| lower[i].ends_with(e))
        {
            let (start, word) = words[i];
            let end = start + word.len();
            cuts.push((end, end));
        }
        i += 1;
    }
    let mut start = 0;
    for (end, next) in cuts {
        push_trimmed(pieces, &sentence[start..end]);
        start = next;
    }
    push_trimmed(pieces, &sentence[start..]);
}

/// Words of the sentence since the last cut (index of the first word after it).
fn cuts_last_word(cuts: &[(usize, usize)], words: &[(usize, &str)]) -> usize {
    match cuts.last() {
        None => 0,
        Some(&(_, next)) => words.iter().take_while(|(start, _)| *start < next).count(),
    }
}

fn word_spans(text: &str) -> Vec<(usize, &str)> {
    let mut spans = Vec::new();
    let mut start = None;
    for (idx, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                spans.push((s, &text[s..idx]));
                start = None;
            }
            (false, None) => start = Some(idx),
            _ => {}
        }
    }
    if let Some(s) = start {
        spans.push((s, &text[s..]));
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_request_stays_whole() {
        assert_eq!(
            split_requests("what's the weather"),
            vec!["what's the weather"]
        );
        assert_eq!(
            split_requests("compare rent and size and commute"),
            vec!["compare rent and size and commute"]
        );
        assert_eq!(
            split_requests("download v1.5 from example.com"),
            vec!["download v1.5 from example.com"]
        );
    }

    #[test]
    fn chained_requests_split() {
        assert_eq!(
            split_requests("check the weather in Busan and put a dentist appointment on friday"),
            vec![
                "check the weather in Busan",
                "put a dentist appointment on friday"
            ]
        );
        assert_eq!(
            split_requests("back up nextcloud first, then update it"),
            vec!["back up nextcloud first", "update it"]
        );
        assert_eq!(
            split_requests("Stop the container. Also email bob; thanks!"),
            vec!["Stop the container", "email bob", "thanks"]
        );
        assert_eq!(split_requests("a\nb c"), vec!["a", "b c"]);
    }

    #[test]
    fn korean_connectives_split() {
        assert_eq!(
            split_requests("날씨 확인하고 치과 예약 잡아줘"),
            vec!["날씨 확인하고", "치과 예약 잡아줘"]
        );
        assert_eq!(
            split_requests("불 꺼줘 그리고 음악 틀어줘"),
            vec!["불 꺼줘", "음악 틀어줘"]
        );
    }

    #[test]
    fn the_shortcut_for_single_requests_changes_nothing() {
        for message in [
            "what's the weather",
            "  , turn on the lights ,",
            "show my calendar for friday",
            "stop the redis container",
            "compare rent, size, commute",
            "???",
            "",
            "handle the backup then",
            "날씨 확인하고 치과 예약 잡아줘",
        ] {
            assert_eq!(
                split_requests(message),
                split_each(message, Vec::new()),
                "{message:?}"
            );
        }
        assert!(!may_chain("show my calendar for friday"));
        assert!(may_chain("lights AND music"));
    }

    #[test]
    fn many_requests_are_capped() {
        let message = "a1. b2. c3. d4. e5. f6. g7. h8.";
        let pieces = split_requests(message);
        assert_eq!(pieces.len(), MAX_REQUESTS);
        assert_eq!(pieces[MAX_REQUESTS - 1], "f6. g7. h8");
    }
}
