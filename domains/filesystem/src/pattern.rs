//! Glob-like name patterns for `find_files`: `*` matches any run of characters
//! within one path segment, `?` exactly one character, and a `**` segment any number
//! of directories. A pattern without `/` is matched against the entry's name; one
//! with `/` against its path relative to the search directory.

/// Longest pattern accepted, in characters.
pub const MAX_PATTERN_CHARS: usize = 256;

#[derive(Debug, Clone)]
pub struct Pattern {
    segments: Vec<Vec<char>>,
    case_sensitive: bool,
    matches_path: bool,
}

impl Pattern {
    pub fn new(pattern: &str, case_sensitive: bool) -> Result<Pattern, String> {
        let pattern = pattern.trim();
        if pattern.is_empty() {
            return Err("the pattern is empty; use e.g. `*.pdf` or `report-??.txt`".into());
        }
        if pattern.chars().count() > MAX_PATTERN_CHARS {
            return Err(format!(
                "the pattern is longer than {MAX_PATTERN_CHARS} characters"
            ));
        }
        let fold = |s: &str| -> Vec<char> {
            if case_sensitive {
                s.chars().collect()
            } else {
                s.chars().flat_map(char::to_lowercase).collect()
            }
        };
        let trimmed = pattern.trim_start_matches("./").trim_matches('/');
        let segments: Vec<Vec<char>> = trimmed
            .split('/')
            .filter(|s| !s.is_empty())
            .map(fold)
            .collect();
        if segments.is_empty() {
            return Err("the pattern has no name to match".into());
        }
        Ok(Pattern {
            matches_path: segments.len() > 1,
            segments,
            case_sensitive,
        })
    }

    /// `relative` uses `/` between segments; `name` is its last segment.
    pub fn matches(&self, relative: &str, name: &str) -> bool {
        let fold = |s: &str| -> Vec<char> {
            if self.case_sensitive {
                s.chars().collect()
            } else {
                s.chars().flat_map(char::to_lowercase).collect()
            }
        };
        if self.matches_path {
            let parts: Vec<Vec<char>> = relative.split('/').map(fold).collect();
            match_segments(&self.segments, &parts)
        } else {
            match_segment(&self.segments[0], &fold(name))
        }
    }
}

/// Segment lists, with `**` standing for zero or more whole segments. Iterative over
/// the last `**` seen, so no input can recurse deeply.
fn match_segments(pattern: &[Vec<char>], parts: &[Vec<char>]) -> bool {
    let is_globstar = |seg: &Vec<char>| seg.len() == 2 && seg[0] == '*' && seg[1] == '*';
    let (mut p, mut s) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while s < parts.len() {
        if p < pattern.len() && is_globstar(&pattern[p]) {
            backtrack = Some((p, s));
            p += 1;
        } else if p < pattern.len() && match_segment(&pattern[p], &parts[s]) {
            p += 1;
            s += 1;
        } else if let Some((star_p, star_s)) = backtrack {
            backtrack = Some((star_p, star_s + 1));
            p = star_p + 1;
            s = star_s + 1;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(is_globstar)
}

/// One segment: `*` and `?` wildcards, the classic linear backtracking match.
fn match_segment(pattern: &[char], text: &[char]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == '?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((star_p, star_t)) = star {
            star = Some((star_p, star_t + 1));
            p = star_p + 1;
            t = star_t + 1;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, relative: &str) -> bool {
        let name = relative.rsplit('/').next().unwrap_or(relative);
        Pattern::new(pattern, false)
            .expect("pattern")
            .matches(relative, name)
    }

    #[test]
    fn wildcards() {
        assert!(m("*.pdf", "docs/Report.PDF"));
        assert!(m("report-??.txt", "report-01.txt"));
        assert!(!m("report-??.txt", "report-1.txt"));
        assert!(m("*", "anything"));
        assert!(m("a*b*c", "aXXbYYc"));
        assert!(!m("a*b*c", "aXXbYY"));
        assert!(m("docs/*.md", "docs/readme.md"));
        assert!(!m("docs/*.md", "docs/sub/readme.md"));
        assert!(m("docs/**/*.md", "docs/sub/deeper/readme.md"));
        assert!(m("docs/**/*.md", "docs/readme.md"));
        assert!(m("**/*.rs", "src/lib.rs"));
        assert!(
            !Pattern::new("A.txt", true)
                .expect("p")
                .matches("a.txt", "a.txt")
        );
        assert!(Pattern::new("", false).is_err());
        // Pathological patterns stay linear-ish.
        let text = "a".repeat(200);
        assert!(!m(&("*a".repeat(100) + "b"), &text));
    }
}
