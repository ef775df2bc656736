//! `cargo xtask lint [--catalog DIR]...`: checks every linked domain and tool (and
//! any toolkit directories given) for mistakes the compiler cannot see, and checks
//! that every domain crate is linked through the hub.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::bail;
use loadout::Registry;
use loadout_router::{Router, RouterConfig};

/// One problem, with enough context to fix it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    pub what: String,
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.message)
    }
}

/// `cargo xtask lint`'s options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Also check this toolkit directory's domains and tools (repeatable).
    #[arg(long = "catalog", value_name = "DIR")]
    pub catalogs: Vec<PathBuf>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let catalogs = &args.catalogs;
    let mut findings = Vec::new();
    match loadout_domains::registry() {
        Ok(registry) => {
            findings.extend(check_registry(&registry));
            findings.extend(check_settings(&registry));
        }
        Err(e) => findings.push(Finding {
            what: "registry".into(),
            message: e.to_string(),
        }),
    }
    findings.extend(check_hub(&workspace_root()));
    for dir in catalogs {
        match Registry::builder().toolkit_dir(dir).and_then(|b| b.build()) {
            Ok(registry) => findings.extend(check_registry(&registry)),
            Err(e) => findings.push(Finding {
                what: format!("catalog {}", dir.display()),
                message: e.to_string(),
            }),
        }
    }

    // Warnings (printed, never failing): near-identical tools across domains.
    let mut registries = Vec::new();
    if let Ok(registry) = loadout_domains::registry() {
        registries.push(registry);
    }
    for dir in catalogs {
        if let Ok(registry) = Registry::builder().toolkit_dir(dir).and_then(|b| b.build()) {
            registries.push(registry);
        }
    }
    for registry in registries {
        let router = Router::new(std::sync::Arc::new(registry), RouterConfig::default());
        for (tool, argument) in router.unfound_ids() {
            println!(
                "lint: warning: tool `{tool}`: no tool is found to find its required `{argument}`; name the tool that does in the argument's description (\"… from list_…\")"
            );
        }
        for warning in similar_across_domains(&router) {
            println!("lint: warning: {warning}");
        }
    }

    if findings.is_empty() {
        let registry = loadout_domains::registry()?;
        println!(
            "lint: ok ({} domains, {} tools linked{})",
            registry.domains().len(),
            registry.all_tools().len(),
            if catalogs.is_empty() {
                String::new()
            } else {
                format!(", {} catalog dir(s)", catalogs.len())
            }
        );
        Ok(())
    } else {
        for finding in &findings {
            eprintln!("lint: {finding}");
        }
        bail!("lint: {} problem(s)", findings.len())
    }
}

/// Cosine above which two tools of different domains count as near-identical: their
/// `name: description` texts, or an example of one and the text or an example of the
/// other, embedded with the built-in encoder. At 0.92 MiniLM-L3 pairs are paraphrases
/// of the same action (`get_exchange_rate` / `get_currency_exchange_rate`); the router
/// can then tell them apart only by their domain's evidence.
pub const NEAR_IDENTICAL_COSINE: f32 = 0.92;

/// Pairs of tools of different domains whose descriptions or examples are
/// near-identical (see [`NEAR_IDENTICAL_COSINE`]), naming both. Empty when the build
/// has no built-in encoder.
fn similar_across_domains(router: &Router) -> Vec<String> {
    let Ok(embedder) = loadout_embed::builtin() else {
        return Vec::new();
    };
    let mut cache =
        loadout_embed::VectorCache::open(&crate::eval::default_vector_cache(), embedder.model_id());
    let texts = router.dense_texts();
    let mut vectors: Vec<(usize, Vec<f32>)> = Vec::new();
    let mut missing: Vec<usize> = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        if router.dense_text_tool(i).is_none() {
            continue;
        }
        match cache.get(text) {
            Some(v) => vectors.push((i, v.to_vec())),
            None => missing.push(i),
        }
    }
    for batch in missing.chunks(loadout_embed::INDEX_BATCH) {
        let batch_texts: Vec<&str> = batch.iter().map(|&i| texts[i].as_str()).collect();
        let Ok(embedded) = embedder.embed(&batch_texts) else {
            return vec!["similarity check skipped: the encoder failed".to_owned()];
        };
        for (&i, vector) in batch.iter().zip(embedded) {
            cache.insert(&texts[i], vector.clone());
            vectors.push((i, vector));
        }
    }
    let _ = cache.save();
    let tools = router.registry().all_tools();
    let mut pairs = BTreeSet::new();
    for (a, (text_a, va)) in vectors.iter().enumerate() {
        let Some(tool_a) = router.dense_text_tool(*text_a).and_then(|t| tools.get(t)) else {
            continue;
        };
        for (text_b, vb) in &vectors[a + 1..] {
            let Some(tool_b) = router.dense_text_tool(*text_b).and_then(|t| tools.get(t)) else {
                continue;
            };
            if tool_a.domain == tool_b.domain {
                continue;
            }
            let cosine: f32 = va.iter().zip(vb).map(|(x, y)| x * y).sum();
            if cosine > NEAR_IDENTICAL_COSINE {
                let (first, second) = if tool_a.name <= tool_b.name {
                    (tool_a, tool_b)
                } else {
                    (tool_b, tool_a)
                };
                pairs.insert(format!(
                    "tools {} ({}) and {} ({}) have near-identical descriptions or examples (cosine {cosine:.2} > {NEAR_IDENTICAL_COSINE})",
                    first.name, first.domain, second.name, second.domain
                ));
            }
        }
    }
    pairs.into_iter().collect()
}

/// Checks that apply to any registry, whatever declared it.
pub fn check_registry(registry: &Registry) -> Vec<Finding> {
    let mut findings = Vec::new();
    for domain in registry.domains() {
        let tool_keywords = registry.tools_of(domain).any(|t| !t.keywords.is_empty());
        if domain.keywords.is_empty() && !tool_keywords && !domain.always_on {
            findings.push(Finding {
                what: format!("domain `{}` ({})", domain.name, domain.origin),
                message: "declares no keywords, neither on the domain nor on any tool: the router can reach it only by similarity; add keywords to `domain!` or to its tools".into(),
            });
        }
        if domain.tools.is_empty() {
            findings.push(Finding {
                what: format!("domain `{}` ({})", domain.name, domain.origin),
                message: "has no tools".into(),
            });
        }
        for keyword in &domain.keywords {
            if keyword.trim().is_empty() || keyword.chars().any(char::is_uppercase) {
                findings.push(Finding {
                    what: format!("domain `{}`", domain.name),
                    message: format!("keyword {keyword:?} must be non-empty lowercase"),
                });
            }
        }
    }
    for tool in registry.all_tools() {
        let what = format!("tool `{}` ({})", tool.name, tool.origin);
        if tool.description.trim().is_empty() {
            findings.push(Finding {
                what: what.clone(),
                message: "has no description: models choose tools by it".into(),
            });
        }
        let schema = &*tool.input_schema;
        if schema.get("type").and_then(|t| t.as_str()) != Some("object") {
            findings.push(Finding {
                what: what.clone(),
                message: format!(
                    "input schema must be an object schema (`\"type\": \"object\"`), found {}",
                    schema
                        .get("type")
                        .map_or("no type".into(), |t| t.to_string())
                ),
            });
        }
        if let Err(e) = loadout::schema::ArgsValidator::new(schema) {
            findings.push(Finding {
                what,
                message: format!("input schema does not compile: {e}"),
            });
        }
    }
    findings
}

/// Every settings key a linked domain needs is declared once with `loadout::setting!`
/// (its kind, who may set it, its validator), so that a write is checked when made
/// and the model cannot set a key that widens what tools reach.
pub fn check_settings(registry: &Registry) -> Vec<Finding> {
    let mut findings = Vec::new();
    for domain in registry.domains() {
        for key in &domain.settings_keys {
            if loadout::setting_spec(key).is_none() {
                findings.push(Finding {
                    what: format!("domain `{}` ({})", domain.name, domain.origin),
                    message: format!(
                        "settings key `{key}` is not declared: declare it with `loadout::setting!` (kind, trust, validator) next to the code that reads it"
                    ),
                });
            }
        }
    }
    let mut seen = BTreeSet::new();
    for spec in loadout::setting_specs() {
        if spec.trust == loadout::Trust::Model && loadout::names_a_place(spec.key) {
            findings.push(Finding {
                what: format!("settings key `{}`", spec.key),
                message: "names a host, path, URL, socket or repository but is declared `trust: Trust::Model`: the model would choose where tools connect or what they reach; leave it to the operator (the default)".into(),
            });
        }
        if !seen.insert(spec.key) {
            findings.push(Finding {
                what: format!("settings key `{}`", spec.key),
                message: "is declared more than once: keep one `loadout::setting!`".into(),
            });
        }
    }
    findings
}

/// Every crate under `domains/` (but the hub) must be a dependency of the hub and
/// have its `link()` called there; otherwise the linker drops its tools.
pub fn check_hub(root: &Path) -> Vec<Finding> {
    let mut findings = Vec::new();
    let domains_dir = root.join("domains");
    let hub_manifest =
        std::fs::read_to_string(domains_dir.join("all/Cargo.toml")).unwrap_or_default();
    let hub_source =
        std::fs::read_to_string(domains_dir.join("all/src/lib.rs")).unwrap_or_default();
    let crates: BTreeSet<String> = std::fs::read_dir(&domains_dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|name| name != "all")
        .collect();
    for name in crates {
        let package = format!("loadout-domain-{name}");
        let module = format!("loadout_domain_{name}");
        if !hub_manifest.contains(&package) {
            findings.push(Finding {
                what: format!("domains/{name}"),
                message: format!("`{package}` is not a dependency of domains/all (the hub): its tools will not be linked"),
            });
        }
        if !hub_source.contains(&module) || !hub_source.contains(&format!("{name}::link()")) {
            findings.push(Finding {
                what: format!("domains/{name}"),
                message: format!("domains/all/src/lib.rs must `pub use {module} as {name};` and call `{name}::link()`"),
            });
        }
    }
    findings
}

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use loadout::{Annotations, Backend, Domain, Registry, Tier, Tool};

    use super::*;

    fn domain(name: &str, keywords: &[&str]) -> Domain {
        Domain {
            name: name.into(),
            description: "A domain.".into(),
            settings_keys: vec![],
            keywords: keywords.iter().map(|k| k.to_string()).collect(),
            tier: Tier::Free,
            always_on: false,
            conflicts: vec![],
            tools: vec![],
            origin: "test".into(),
        }
    }

    fn tool(name: &str, domain: &str, schema: serde_json::Value) -> Tool {
        Tool {
            name: name.into(),
            domain: domain.into(),
            title: None,
            description: "Does a thing.".into(),
            hint: "Does a thing.".into(),
            keywords: vec![],
            examples: vec![],
            conflicts: vec![],
            tier: Tier::Free,
            annotations: Annotations::default(),
            pins_domain: false,
            input_schema: Arc::new(schema),
            backend: Backend::None,
            origin: "test".into(),
        }
    }

    #[test]
    fn keywordless_domain_is_flagged() {
        let registry = Registry::from_parts(
            vec![domain("quiet", &[]), domain("loud", &["loud"])],
            vec![
                tool("a", "quiet", serde_json::json!({"type": "object"})),
                tool("b", "loud", serde_json::json!({"type": "object"})),
            ],
        )
        .expect("registry");
        let findings = check_registry(&registry);
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(
            findings[0].what.contains("`quiet`") && findings[0].message.contains("no keywords")
        );
    }

    #[test]
    fn non_object_schema_and_empty_description_are_flagged() {
        let mut t = tool("a", "d", serde_json::json!({"type": "string"}));
        t.description.clear();
        let registry = Registry::from_parts(vec![domain("d", &["x"])], vec![t]).expect("registry");
        let messages: Vec<String> = check_registry(&registry)
            .into_iter()
            .map(|f| f.message)
            .collect();
        assert!(
            messages.iter().any(|m| m.contains("no description")),
            "{messages:?}"
        );
        assert!(
            messages.iter().any(|m| m.contains("object schema")),
            "{messages:?}"
        );
    }

    #[test]
    fn duplicate_tool_names_fail_naming_both() {
        let mut second = tool("a", "d", serde_json::json!({"type": "object"}));
        second.origin = "other.rs:9".into();
        let err = Registry::from_parts(
            vec![domain("d", &["x"])],
            vec![
                tool("a", "d", serde_json::json!({"type": "object"})),
                second,
            ],
        )
        .expect_err("duplicate");
        let message = err.to_string();
        assert!(
            message.contains("test") && message.contains("other.rs:9"),
            "{message}"
        );
    }

    /// House rule: the lint runs under `cargo test` too.
    #[test]
    fn linked_domains_pass_the_lint() {
        let registry = loadout_domains::registry().expect("registry builds");
        let findings = check_registry(&registry);
        assert!(findings.is_empty(), "{findings:#?}");
        let findings = check_settings(&registry);
        assert!(findings.is_empty(), "{findings:#?}");
        let findings = check_hub(&workspace_root());
        assert!(findings.is_empty(), "{findings:#?}");
    }
}
