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
//!   and which does not itself need that id;
//! - a bare `id`/`ids` takes its nouns from its description, the word before each
//!   "id"/"ids" ("Series ids (Sonarr) or movie ids (Radarr)" → series, movie), and
//!   is found by each noun's finder.
//! - a recipient argument (`to`, `attendees`, "Recipient addresses", required or
//!   not) of a tool that sends or creates (no finding verb in its name) is found by
//!   an address-book search in any domain (`search_contacts`): "forward the invoice
//!   to my accountant" names a person, the tool takes an address.

use loadout::Tool;

use crate::build::{name_words, spaced};

/// Finding verbs, best first: a listing shows what exists, a search narrows it, a
/// lookup may search outside (a catalogue of things not yet added), `get` is the
/// least specific.
const FINDERS: [&[&str]; 4] = [&["list"], &["search", "find"], &["lookup"], &["get"]];

/// Per tool, the tools that find its required ids (see the module docs).
pub(super) fn prerequisites(
    tools: &[Tool],
    tool_domain: &[usize],
    tools_by_domain: &[Vec<usize>],
    tool_idx: impl Fn(&str) -> Option<usize>,
) -> Vec<Vec<usize>> {
    let finders = Finders::new(tools, tool_domain, tools_by_domain, &tool_idx);
    let address_book = address_book(&finders.words);
    (0..tools.len())
        .map(|t| {
            let mut found = Vec::new();
            for argument in required_arguments(&tools[t]) {
                for u in finders.of(t, &argument) {
                    if !found.contains(&u) {
                        found.push(u);
                    }
                }
            }
            if let Some(u) = address_book
                && u != t
                && takes_recipients(&tools[t], &finders.words[t])
                && !found.contains(&u)
            {
                found.push(u);
            }
            found
        })
        .collect()
}

/// Names of arguments that take people to send to or invite.
const RECIPIENT_NAMES: [&str; 6] = [
    "to",
    "cc",
    "recipient",
    "recipients",
    "attendees",
    "invitees",
];
/// Name words of an address book's entries.
const CONTACT_NOUNS: [&str; 4] = ["contact", "contacts", "people", "person"];

/// Whether a tool that sends or creates takes recipients: an argument named like
/// one, or described as recipients or email addresses.
fn takes_recipients(tool: &Tool, name_words: &[&str]) -> bool {
    if name_words
        .iter()
        .any(|w| FINDERS.iter().any(|verbs| verbs.contains(w)) || *w == "read")
    {
        return false;
    }
    let Some(properties) = tool
        .input_schema
        .get("properties")
        .and_then(|p| p.as_object())
    else {
        return false;
    };
    properties.iter().any(|(name, property)| {
        let description = property
            .get("description")
            .and_then(|d| d.as_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        RECIPIENT_NAMES.contains(&name.as_str())
            || description.contains("recipient")
            || description.contains("email address")
    })
}

/// The address book's search: a tool with a finding verb and a contact noun in its
/// name, the most specific verb first (`search_contacts` before `list_contacts`),
/// then the plainest name.
fn address_book(words: &[Vec<&str>]) -> Option<usize> {
    [&["search", "find"][..], &["lookup"], &["list"]]
        .iter()
        .find_map(|verbs| {
            (0..words.len())
                .filter(|&u| words[u].iter().any(|w| verbs.contains(w)))
                .filter(|&u| words[u].iter().any(|w| CONTACT_NOUNS.contains(w)))
                .min_by_key(|&u| (words[u].len(), u))
        })
}

/// Required id arguments (`<noun>_id`, `<noun>_ids`) no tool is found to find, as
/// `(tool, argument)`: a model must then get the id some other way, and the router
/// cannot send the way along. Naming the finder in the argument's description
/// ("Series id from list_series") fixes it.
pub(super) fn unfound_ids(
    tools: &[Tool],
    tool_domain: &[usize],
    tools_by_domain: &[Vec<usize>],
    tool_idx: impl Fn(&str) -> Option<usize>,
) -> Vec<(String, String)> {
    let finders = Finders::new(tools, tool_domain, tools_by_domain, &tool_idx);
    let mut unfound = Vec::new();
    for (t, tool) in tools.iter().enumerate() {
        for argument in required_arguments(tool) {
            if !argument.nouns.is_empty() && finders.of(t, &argument).is_empty() {
                unfound.push((tool.name.clone(), argument.name.to_owned()));
            }
        }
    }
    unfound
}

/// A required argument: its name, its description, and for an id the nouns of what
/// it identifies (`series_id` → `series`).
struct Argument<'a> {
    name: &'a str,
    description: &'a str,
    nouns: Vec<String>,
}

fn required_arguments(tool: &Tool) -> Vec<Argument<'_>> {
    let schema = &*tool.input_schema;
    let Some(required) = schema.get("required").and_then(|r| r.as_array()) else {
        return Vec::new();
    };
    required
        .iter()
        .filter_map(|name| name.as_str())
        .map(|name| {
            let description = schema
                .get("properties")
                .and_then(|p| p.get(name))
                .and_then(|p| p.get("description"))
                .and_then(|d| d.as_str())
                .unwrap_or("");
            Argument {
                name,
                description,
                nouns: id_nouns(name, description),
            }
        })
        .collect()
}

/// `series_id` → `series`, `entity_ids` → `entity`, `seriesId` → `series` (a name's
/// words as [`spaced`] finds them); a bare `id`/`ids` names what its description puts
/// before each "id"/"ids" (`Series ids or movie ids` → series, movie); anything else
/// names nothing.
fn id_nouns(name: &str, description: &str) -> Vec<String> {
    let is_id = |w: &str| matches!(w, "id" | "ids");
    let name_words: Vec<String> = spaced(name)
        .split_whitespace()
        .map(str::to_lowercase)
        .collect();
    match name_words.as_slice() {
        [noun @ .., last] if is_id(last) && !noun.is_empty() => return vec![noun.join("_")],
        [last] if is_id(last) => {}
        _ => return Vec::new(),
    }
    let words: Vec<String> = description
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    let mut nouns: Vec<String> = Vec::new();
    for pair in words.windows(2) {
        if is_id(&pair[1]) && !nouns.contains(&pair[0]) {
            nouns.push(pair[0].clone());
        }
    }
    nouns
}

/// What finding a tool's arguments needs about every tool.
struct Finders<'a, F> {
    tool_domain: &'a [usize],
    tools_by_domain: &'a [Vec<usize>],
    tool_idx: &'a F,
    /// Per tool: the nouns of its required ids.
    needs: Vec<Vec<String>>,
    /// Per tool: the words of its name.
    words: Vec<Vec<&'a str>>,
}

impl<'a, F: Fn(&str) -> Option<usize>> Finders<'a, F> {
    fn new(
        tools: &'a [Tool],
        tool_domain: &'a [usize],
        tools_by_domain: &'a [Vec<usize>],
        tool_idx: &'a F,
    ) -> Self {
        Finders {
            tool_domain,
            tools_by_domain,
            tool_idx,
            needs: tools
                .iter()
                .map(|t| {
                    required_arguments(t)
                        .into_iter()
                        .flat_map(|a| a.nouns)
                        .collect()
                })
                .collect(),
            words: tools
                .iter()
                .map(|t| name_words(&t.name).collect())
                .collect(),
        }
    }

    /// The tools that find `argument` of tool `t`: those its description names, else
    /// the best finder of each of its nouns in `t`'s domain.
    fn of(&self, t: usize, argument: &Argument<'_>) -> Vec<usize> {
        let mut found = Vec::new();
        let words = argument
            .description
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        for word in words {
            if let Some(u) = (self.tool_idx)(word)
                && u != t
                && !found.contains(&u)
            {
                found.push(u);
            }
        }
        if !found.is_empty() {
            return found;
        }
        let Some(members) = self
            .tool_domain
            .get(t)
            .and_then(|&d| self.tools_by_domain.get(d))
        else {
            return found;
        };
        for noun in &argument.nouns {
            let noun_words: Vec<&str> = name_words(noun).collect();
            let finder = FINDERS.iter().find_map(|verbs| {
                members
                    .iter()
                    .copied()
                    .filter(|&u| u != t && !self.needs[u].contains(noun))
                    .filter(|&u| self.words[u].iter().any(|w| verbs.contains(w)))
                    .filter(|&u| {
                        noun_words
                            .iter()
                            .all(|n| self.words[u].iter().any(|w| names(n, w)))
                    })
                    // The plainest name: `list_series` before `list_series_episodes`.
                    .min_by_key(|&u| (self.words[u].len(), u))
            });
            if let Some(u) = finder
                && !found.contains(&u)
            {
                found.push(u);
            }
        }
        found
    }
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
    use super::{id_nouns, names};

    #[test]
    fn ids_name_their_nouns() {
        assert_eq!(id_nouns("series_id", "Sonarr series id."), ["series"]);
        assert_eq!(id_nouns("entity_ids", ""), ["entity"]);
        assert_eq!(
            id_nouns("ids", "Series ids (Sonarr) or movie ids (Radarr)."),
            ["series", "movie"]
        );
        assert_eq!(id_nouns("id", "The container id or name."), ["container"]);
        assert!(id_nouns("ids", "Identifiers.").is_empty());
        assert!(id_nouns("query", "Series id to search for.").is_empty());
        assert!(id_nouns("_id", "").is_empty());
        assert_eq!(id_nouns("seriesId", ""), ["series"]);
        assert_eq!(id_nouns("userIDs", ""), ["user"]);
        assert_eq!(id_nouns("tv-series-id", ""), ["tv_series"]);
        assert!(id_nouns("identity", "").is_empty());
    }

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
