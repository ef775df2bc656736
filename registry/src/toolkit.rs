//! Declarative toolkits: domains and tools declared in JSON files (the format of
//! the shared eval catalog). They become the same [`Domain`] and [`Tool`] values as
//! macro-declared ones; their tools route, and calling one answers "no backend".

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::tool::first_sentence;
use crate::{Annotations, Backend, Domain, RegistryError, Tier, Tool};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainFile {
    domain: String,
    description: String,
    #[serde(default)]
    keywords: Vec<String>,
    #[serde(default)]
    settings_keys: Vec<String>,
    #[serde(default)]
    always_on: bool,
    #[serde(default)]
    tier: Tier,
    #[serde(default)]
    conflicts: Vec<String>,
    tools: Vec<ToolFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolFile {
    name: String,
    description: String,
    input_schema: serde_json::Value,
    #[serde(default)]
    keywords: Vec<String>,
    #[serde(default)]
    examples: Vec<String>,
    #[serde(default)]
    conflicts: Vec<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    annotations: Option<Annotations>,
}

/// One parsed toolkit file.
#[derive(Debug, Clone)]
pub struct Toolkit {
    pub domain: Domain,
    pub tools: Vec<Tool>,
}

/// Parses one toolkit file.
pub fn load_file(path: &Path) -> Result<Toolkit, RegistryError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| RegistryError::Toolkit {
        path: origin.clone(),
        message: e.to_string(),
    })?;
    parse(&text, &origin)
}

/// Parses toolkit JSON; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<Toolkit, RegistryError> {
    let file: DomainFile = serde_json::from_str(text).map_err(|e| RegistryError::Toolkit {
        path: origin.to_owned(),
        message: e.to_string(),
    })?;
    let tools = file
        .tools
        .into_iter()
        .map(|t| {
            let mut schema = t.input_schema;
            crate::schema::normalize_object_schema(&mut schema);
            let description = t.description.trim().to_owned();
            Tool {
                hint: first_sentence(&description),
                description,
                name: t.name,
                domain: file.domain.clone(),
                title: t.title,
                keywords: lowercase_all(t.keywords),
                examples: t.examples,
                conflicts: t.conflicts,
                tier: file.tier,
                annotations: t.annotations.unwrap_or_default(),
                pins_domain: false,
                input_schema: Arc::new(schema),
                backend: Backend::None,
                origin: origin.to_owned(),
            }
        })
        .collect::<Vec<_>>();
    let mut tool_names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
    tool_names.sort();
    Ok(Toolkit {
        domain: Domain {
            name: file.domain,
            description: file.description.trim().to_owned(),
            settings_keys: file.settings_keys,
            keywords: lowercase_all(file.keywords),
            tier: file.tier,
            always_on: file.always_on,
            conflicts: file.conflicts,
            tools: tool_names,
            origin: origin.to_owned(),
        },
        tools,
    })
}

/// Every `*.json` file of a directory, in file-name order.
pub fn load_dir(dir: &Path) -> Result<Vec<Toolkit>, RegistryError> {
    let entries = std::fs::read_dir(dir).map_err(|e| RegistryError::Toolkit {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let mut paths = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "json"))
        .collect::<Vec<_>>();
    paths.sort();
    paths.iter().map(|p| load_file(p)).collect()
}

fn lowercase_all(words: Vec<String>) -> Vec<String> {
    words.into_iter().map(|w| w.to_lowercase()).collect()
}
