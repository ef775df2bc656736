//! Prerequisites: the tool of a domain that finds what another tool's required id
//! argument names. `arr_delete_series(series_id)` cannot run on "the walking dead"
//! until `arr_list_series` has turned the title into an id, yet the message names
//! only the deletion; sending one without the other leaves the model stuck.
//!
//! Derived from schemas and names alone, so it holds for any catalog:
//! - a required argument whose description names a tool ("Event id from
//!   list_events") is found by that tool, in whatever domain;
//! - a required argument `<noun>_id` or `<noun>_ids` is found by a tool of the same
//!   domain whose name has a finding verb and the noun's words (singular or plural),
//!   and which does not itself need that id.

use crate::Tool;

/// Finding verbs, best first: a listing shows what exists, a search narrows it, a
/// lookup may search outside (a catalogue of things not yet added), `get` is the
/// least specific.
const FINDERS: [&[&str]; 4] = [&["list"], &["search", "find"], &["lookup"], &["get"]];

/// Per tool, the tools of its domain that find its required ids (at most one per id
/// argument).
pub(super) fn prerequisites(
    tools: &[Tool],
    tool_domain: &[usize],
    tools_by_domain: &[Vec<usize>],
    tool_idx: impl Fn(&str) -> Option<usize>,
) -> Vec<Vec<usize>> {
    let required: Vec<Vec<&str>> = tools.iter().map(required_ids).collect();
    let words: Vec<Vec<&str>> = tools.iter().map(|t| t.name.split('_').collect()).collect();
    (0..tools.len())
        .map(|t| {
            let mut found = Vec::new();
            for description in required_descriptions(&tools[t]) {
                for word in description.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                    if let Some(u) = tool_idx(word)
                        && u != t
                        && !found.contains(&u)
                    {
                        found.push(u);
                    }
                }
            }
            let Some(members) = tool_domain.get(t).and_then(|&d| tools_by_domain.get(d)) else {
                return found;
            };
            for &id in &required[t] {
                let noun: Vec<&str> = id.split('_').filter(|w| !w.is_empty()).collect();
                if noun.is_empty() {
                    continue;
                }
                let finder = FINDERS.iter().find_map(|verbs| {
                    members
                        .iter()
                        .copied()
                        .filter(|&u| u != t && !required[u].contains(&id))
                        .filter(|&u| words[u].iter().any(|w| verbs.contains(w)))
                        .filter(|&u| noun.iter().all(|n| words[u].iter().any(|w| names(n, w))))
                        // The plainest name: `list_series` before `list_series_episodes`.
                        .min_by_key(|&u| (words[u].len(), u))
                });
                if let Some(u) = finder
                    && !found.contains(&u)
                {
                    found.push(u);
                }
            }
            found
        })
        .collect()
}

/// The descriptions of a tool's required arguments.
fn required_descriptions(tool: &Tool) -> Vec<&str> {
    let schema = &*tool.input_schema;
    let Some(required) = schema.get("required").and_then(|r| r.as_array()) else {
        return Vec::new();
    };
    required
        .iter()
        .filter_map(|name| name.as_str())
        .filter_map(|name| {
            schema
                .get("properties")?
                .get(name)?
                .get("description")?
                .as_str()
        })
        .collect()
}

/// The nouns of a tool's required id arguments: `series_id` → `series`,
/// `entity_ids` → `entity`; a bare `id`/`ids` names nothing.
fn required_ids(tool: &Tool) -> Vec<&str> {
    let Some(required) = tool.input_schema.get("required").and_then(|r| r.as_array()) else {
        return Vec::new();
    };
    required
        .iter()
        .filter_map(|name| name.as_str())
        .filter_map(|name| {
            name.strip_suffix("_ids")
                .or_else(|| name.strip_suffix("_id"))
        })
        .filter(|noun| !noun.is_empty())
        .collect()
}

/// Whether the name word `word` is `noun` or a regular plural of it.
fn names(noun: &str, word: &str) -> bool {
    if word == noun {
        return true;
    }
    let Some(stem) = word.strip_suffix('s') else {
        return false;
    };
    stem == noun
        || stem.strip_suffix('e') == Some(noun)
        || (stem
            .strip_suffix("ie")
            .is_some_and(|s| noun.strip_suffix('y') == Some(s)))
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn plurals_name_their_noun() {
        assert!(names("series", "series"));
        assert!(names("session", "sessions"));
        assert!(names("entity", "entities"));
        assert!(names("box", "boxes"));
        assert!(!names("app", "apple"));
        assert!(!names("user", "usage"));
        assert!(!names("item", "its"));
    }
}
