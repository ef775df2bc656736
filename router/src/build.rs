//! The indexes [`Router::new`](crate::Router::new) builds once per registry, one
//! builder each.

use loadout::{Domain, Registry, Tool};

use crate::embed::DenseOwner;
use crate::keywords::{KeywordIndex, KeywordOwner};
use crate::lexical::{Bm25Index, Field};
use crate::tokens;

/// Tool-ranking bonus of read tools (`list_`, `get_`, `search_`, `_status`): a request
/// to act on a named thing usually needs the lookup that resolves the name first
/// (`switch Shogun to the 4k profile` needs `arr_list_series`).
const READ_PRIOR: f32 = 0.12;

/// Every domain's and tool's keywords in one automaton.
pub(crate) fn keyword_index(domains: &[Domain], tools: &[Tool]) -> KeywordIndex {
    let keyword_pairs = domains
        .iter()
        .enumerate()
        .flat_map(|(d, domain)| {
            domain
                .keywords
                .iter()
                .map(move |k| (k.as_str(), KeywordOwner::Domain(d)))
        })
        .chain(tools.iter().enumerate().flat_map(|(t, tool)| {
            tool.keywords
                .iter()
                .map(move |k| (k.as_str(), KeywordOwner::Tool(t)))
        }));
    KeywordIndex::new(keyword_pairs)
}

/// The words of a tool's or domain's name: its parts between `_` and `-` (the only
/// separators a registered name may have). Every rule that reads a name's words
/// (the read prior, the action a message names, the finders of an argument) splits
/// it here, so `list-files` reads as `list_files` does.
pub(crate) fn name_words(name: &str) -> impl Iterator<Item = &str> {
    name.split(['_', '-']).filter(|w| !w.is_empty())
}

/// A tool's, domain's or parameter's name with its separators (`_`, `-`, a camelCase
/// capital) as spaces: words BM25 can match.
pub(crate) fn spaced(name: &str) -> String {
    let mut spaced = String::with_capacity(name.len() + 4);
    let mut after_word_char = false;
    for c in name.chars() {
        match c {
            '_' | '-' => spaced.push(' '),
            // A parameter's camelCase (`startDate`) splits as a name's `_` does.
            c if c.is_uppercase() && after_word_char => {
                spaced.push(' ');
                spaced.push(c);
            }
            c => spaced.push(c),
        }
        after_word_char = c.is_lowercase() || c.is_ascii_digit();
    }
    spaced
}

/// BM25 over the tools (name twice as heavy as description, keywords, examples, and
/// the parameters the schema names and describes) and over the domains (name,
/// description, keywords).
pub(crate) fn bm25_indexes(domains: &[Domain], tools: &[Tool]) -> (Bm25Index, Bm25Index) {
    let spaced_tool_names: Vec<String> = tools.iter().map(|t| spaced(&t.name)).collect();
    let joined_tool_keywords: Vec<String> = tools.iter().map(|t| t.keywords.join(" ")).collect();
    let joined_tool_examples: Vec<String> = tools.iter().map(|t| t.examples.join(" . ")).collect();
    let tool_parameters: Vec<String> = tools
        .iter()
        .map(|t| parameters_text(&t.input_schema))
        .collect();
    let joined_domain_keywords: Vec<String> =
        domains.iter().map(|d| d.keywords.join(" ")).collect();
    let spaced_domain_names: Vec<String> = domains.iter().map(|d| spaced(&d.name)).collect();
    let field = |text, weight| Field { text, weight };
    let tool_documents: Vec<Vec<Field<'_>>> = tools
        .iter()
        .enumerate()
        .map(|(t, tool)| {
            vec![
                field(&spaced_tool_names[t], 2.0),
                field(&tool.description, 1.0),
                field(&joined_tool_keywords[t], 1.0),
                field(&joined_tool_examples[t], 1.0),
                field(&tool_parameters[t], 1.0),
            ]
        })
        .collect();
    let domain_documents: Vec<Vec<Field<'_>>> = domains
        .iter()
        .enumerate()
        .map(|(d, domain)| {
            vec![
                field(&spaced_domain_names[d], 2.0),
                field(&domain.description, 1.0),
                field(&joined_domain_keywords[d], 1.0),
            ]
        })
        .collect();
    (
        Bm25Index::new(&tool_documents),
        Bm25Index::new(&domain_documents),
    )
}

/// A schema's top-level parameters as text: each one's spaced name and description.
/// They say what a tool acts on ("torrent hashes", "speed limit in bytes per second")
/// in words a request uses and a terse description may not.
fn parameters_text(schema: &serde_json::Value) -> String {
    let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) else {
        return String::new();
    };
    let mut text = String::new();
    for (name, property) in properties {
        text.push_str(&spaced(name));
        text.push_str(". ");
        if let Some(description) = property.get("description").and_then(|d| d.as_str()) {
            text.push_str(description);
            text.push(' ');
        }
    }
    text
}

/// The o200k_base tokens of each tool's definition, of each domain's tools, of each
/// tool's hint, and of every tool.
pub(crate) struct TokenCosts {
    pub(crate) tools: Vec<usize>,
    pub(crate) domains: Vec<usize>,
    pub(crate) hints: Vec<usize>,
    pub(crate) all: usize,
}

pub(crate) fn token_costs(tools: &[Tool], tools_by_domain: &[Vec<usize>]) -> TokenCosts {
    let tool_tokens: Vec<usize> = tools.iter().map(tokens::tool_cost).collect();
    TokenCosts {
        hints: tools
            .iter()
            .map(|t| tokens::count_json(&loadout::export::hint(t)))
            .collect(),
        all: tool_tokens.iter().sum(),
        domains: tools_by_domain
            .iter()
            .map(|members| members.iter().map(|&t| tool_tokens[t]).sum())
            .collect(),
        tools: tool_tokens,
    }
}

/// Declared conflicts, both ways: per tool, per domain.
pub(crate) fn conflicts(registry: &Registry) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
    let tools = registry.all_tools();
    let mut tool_conflicts = vec![Vec::new(); tools.len()];
    for (t, tool) in tools.iter().enumerate() {
        for other in tool
            .conflicts
            .iter()
            .filter_map(|name| registry.tool_idx(name))
        {
            if other != t {
                push_unique(&mut tool_conflicts[t], other);
                push_unique(&mut tool_conflicts[other], t);
            }
        }
    }
    let domains = registry.domains();
    let mut domain_conflicts = vec![Vec::new(); domains.len()];
    for (d, domain) in domains.iter().enumerate() {
        for other in domain
            .conflicts
            .iter()
            .filter_map(|name| registry.domain_idx(name))
        {
            if other != d {
                push_unique(&mut domain_conflicts[d], other);
                push_unique(&mut domain_conflicts[other], d);
            }
        }
    }
    (tool_conflicts, domain_conflicts)
}

/// Per tool, [`READ_PRIOR`] for a read tool, else 0.
pub(crate) fn read_priors(tools: &[Tool]) -> Vec<f32> {
    tools
        .iter()
        .map(|t| {
            let reads = ["list", "get", "search", "find", "lookup", "query"];
            let reads_first = name_words(&t.name).any(|w| reads.contains(&w))
                || name_words(&t.name).last() == Some("status");
            if reads_first { READ_PRIOR } else { 0.0 }
        })
        .collect()
}

/// Per tool, the tools it is a prerequisite of.
pub(crate) fn consumers(prerequisites: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let mut consumers = vec![Vec::new(); prerequisites.len()];
    for (t, finders) in prerequisites.iter().enumerate() {
        for &p in finders {
            consumers[p].push(t);
        }
    }
    consumers
}

/// Dense texts: per tool its spaced name and description, then each example; per
/// domain its name and description.
pub(crate) fn dense_texts(domains: &[Domain], tools: &[Tool]) -> (Vec<String>, Vec<DenseOwner>) {
    let mut dense_texts = Vec::with_capacity(tools.len() + domains.len());
    let mut dense_owners = Vec::with_capacity(tools.len() + domains.len());
    for (t, tool) in tools.iter().enumerate() {
        dense_texts.push(format!("{}: {}", spaced(&tool.name), tool.description));
        dense_owners.push(DenseOwner::Tool(t));
        for example in tool.examples.iter().filter(|e| !e.trim().is_empty()) {
            dense_texts.push(example.clone());
            dense_owners.push(DenseOwner::Tool(t));
        }
    }
    for (d, domain) in domains.iter().enumerate() {
        dense_texts.push(format!("{}: {}", spaced(&domain.name), domain.description));
        dense_owners.push(DenseOwner::Domain(d));
    }
    (dense_texts, dense_owners)
}

fn push_unique(list: &mut Vec<usize>, value: usize) {
    if !list.contains(&value) {
        list.push(value);
    }
}
