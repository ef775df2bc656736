//! Domains: groups of tools that switch on together when their settings exist.

use serde::Serialize;

use crate::Tier;

/// The link-time record [`domain!`](crate::domain) submits.
#[derive(Debug)]
pub struct DomainEntry {
    pub name: &'static str,
    pub description: &'static str,
    pub settings_keys: &'static [&'static str],
    pub keywords: &'static [&'static str],
    pub tier: Tier,
    pub always_on: bool,
    pub conflicts: &'static [&'static str],
    pub file: &'static str,
    pub line: u32,
}

inventory::collect!(DomainEntry);

/// A domain as the registry and router see it.
#[derive(Debug, Clone, Serialize)]
pub struct Domain {
    pub name: String,
    pub description: String,
    /// Settings that must all have values for the domain to be active; empty means
    /// always active.
    pub settings_keys: Vec<String>,
    pub keywords: Vec<String>,
    pub tier: Tier,
    /// Exposed on every turn whatever the message (only `core`).
    pub always_on: bool,
    pub conflicts: Vec<String>,
    /// Tool names, sorted.
    pub tools: Vec<String>,
    pub origin: String,
}

impl Domain {
    pub fn from_entry(entry: &DomainEntry) -> Domain {
        Domain {
            name: entry.name.to_owned(),
            description: entry.description.trim().to_owned(),
            settings_keys: entry.settings_keys.iter().map(|k| k.to_string()).collect(),
            keywords: entry.keywords.iter().map(|k| k.to_string()).collect(),
            tier: entry.tier,
            always_on: entry.always_on,
            conflicts: entry.conflicts.iter().map(|k| k.to_string()).collect(),
            tools: Vec::new(),
            origin: format!("{}:{}", entry.file, entry.line),
        }
    }

    /// Settings keys this domain needs that have no value in `is_set`.
    pub fn missing_settings(&self, is_set: impl Fn(&str) -> bool) -> Vec<&str> {
        self.settings_keys
            .iter()
            .map(String::as_str)
            .filter(|key| !is_set(key))
            .collect()
    }
}
