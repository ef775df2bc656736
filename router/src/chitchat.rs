//! "No tool needed": greetings, thanks and acknowledgements.
//!
//! A message is chit-chat when it is short (at most [`MAX_WORDS`] words), contains a
//! social marker (thanks, a greeting, laughter, praise, a sign-off, in English or
//! Korean) and every other word is filler (`ok`, `that's all`, `you`): `thanks, now
//! restart plex` is routed as usual. Bare confirmations (`yes`, `ok do it`, `go with
//! immich`) are not chit-chat: they are follow-ups that carry over the last turn's
//! tools. Filler holds no word that asks for something (`set it up` is a request).

/// Longest chit-chat message, in words.
const MAX_WORDS: usize = 8;

/// Words that make a message social rather than a request.
const MARKERS: &[&str] = &[
    "awesome",
    "bye",
    "cheers",
    "cool",
    "evening",
    "fantastic",
    "great",
    "haha",
    "hahaha",
    "hello",
    "hey",
    "hi",
    "hiya",
    "lol",
    "lmao",
    "morning",
    "nice",
    "night",
    "nvm",
    "perfect",
    "sweet",
    "thank",
    "thanks",
    "thanx",
    "thx",
    "ty",
    "tysm",
    "wow",
    "yo",
];

/// Words that may accompany a marker without making the message a request.
const FILLER: &[&str] = &[
    "a", "again", "all", "alright", "and", "anyway", "are", "bunch", "but", "day", "doing", "for",
    "good", "going", "how's", "got", "how", "i", "i'll", "i'm", "it", "it's", "later", "lot",
    "man", "mate", "mind", "much", "never", "now", "ok", "okay", "oh", "so", "that", "that's",
    "thats", "the", "then", "there", "this", "to", "try", "very", "was", "we're", "well", "what's",
    "works", "worked", "you", "your", "fixed", "done", "is", "it's", "has", "have", "been",
    "helpful", "glad", "great", "s", "all", "set", "bro", "dude", "friend", "everyone", "buddy",
    "see", "soon", "talk", "today", "tonight", "tomorrow", "ya", "catch",
];

/// Korean words (or their stems) that make a message social.
const KOREAN_MARKERS: &[&str] = &[
    "고마워",
    "고맙",
    "감사",
    "땡큐",
    "안녕",
    "ㅋㅋ",
    "ㅎㅎ",
    "좋아",
    "좋네",
    "최고",
    "수고",
    "잘자",
    "굿",
];

/// Korean filler that may accompany a marker.
const KOREAN_FILLER: &[&str] = &[
    "알겠어",
    "알았어",
    "오케이",
    "응",
    "그래",
    "네",
    "정말",
    "진짜",
    "다",
    "됐어",
];

/// Whether `message` is only social talk (see the module docs). It stops at the
/// first word that asks for something, most messages' first or second.
pub(crate) fn is_chitchat(message: &str) -> bool {
    let lowered = message.to_lowercase();
    let words = lowered
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '.' | '!' | '?' | '~' | ';' | ':'))
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\''))
        .filter(|w| !w.is_empty());
    let mut has_marker = false;
    for (i, word) in words.enumerate() {
        if i == MAX_WORDS {
            return false;
        }
        // Hangul is never ASCII: an ASCII word skips the Korean lists.
        let korean = !word.is_ascii();
        if MARKERS.contains(&word) || korean && KOREAN_MARKERS.iter().any(|m| word.contains(m)) {
            has_marker = true;
        } else if !(FILLER.contains(&word)
            || korean && KOREAN_FILLER.iter().any(|f| word.starts_with(f)))
        {
            return false;
        }
    }
    has_marker
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thanks_and_greetings_are_chitchat() {
        for message in [
            "thanks",
            "lol thanks",
            "ok that fixed it, thanks",
            "perfect, thanks",
            "ok thanks, that's all",
            "hey!",
            "good morning! how's it going",
            "고마워~",
            "알겠어 땡큐",
            "cool, thanks. I'll try it later",
            "cool, got it, see you later",
            "great, that's all for today",
        ] {
            assert!(is_chitchat(message), "{message}");
        }
    }

    #[test]
    fn requests_and_confirmations_are_not() {
        for message in [
            "yes do it",
            "ok go with immich",
            "thanks, now restart plex",
            "nice, add the second one too",
            "thanks, see what's failing",
            "great, set it up",
            "거실 불 꺼줘",
            "",
        ] {
            assert!(!is_chitchat(message), "{message}");
        }
    }
}
