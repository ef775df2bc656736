//! `loadout.toml`: the one config file, read once at start by every command.
//!
//! ```toml
//! [router]                 # any field of `RouterConfig`; the rest keep defaults
//! token_budget = 3000
//! idle_turns = 8
//!
//! [servers.time]           # upstream MCP servers, see `mcp::upstream`
//! command = "uvx"
//! args = ["mcp-server-time"]
//! keywords = ["time zone"]
//! ```
//!
//! It lives in the data dir, or wherever `--config PATH` (`LOADOUT_CONFIG`) says. A
//! missing default file means defaults; a missing named file, an unknown key, a
//! value of the wrong type or out of range is an error at start, every problem at
//! once, so a typo cannot quietly route with defaults.
//!
//! A running `loadout serve` or `loadout mcp` reads it again on `SIGHUP`
//! ([`crate::app::reload_on_hangup`]): `[router]` applies to the turns that start after the
//! reload; the MCP server connects, stops or restarts upstream servers to match
//! `[servers]` (the unchanged ones keep their connections); a file with problems is refused, named as at start, and the process keeps the
//! config it had.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use loadout_router::RouterConfig;
use loadout_router::scorer::Weights;
use serde::Deserialize;

use crate::mcp::upstream::{self, ServerConfig};

/// The config file's name in the data dir.
pub const CONFIG_FILE: &str = "loadout.toml";

/// The weights `loadout fit` fitted on this deployment's sessions, in the data dir;
/// without it the router scores with the weights it ships with.
pub const WEIGHTS_FILE: &str = "weights.json";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    servers: BTreeMap<String, ServerConfig>,
    #[serde(default)]
    router: RouterConfig,
}

/// The config file, checked.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    /// Where it was read from (or would have been: a missing default file).
    pub path: PathBuf,
    /// Enabled upstream servers by domain slug (`mcp_<slug>`).
    pub servers: Vec<(String, ServerConfig)>,
    /// The router's tunables: every router an entry point builds uses these.
    pub router: RouterConfig,
    /// The user named the file (`--config`): a reload must find it too.
    explicit: bool,
    /// The scorer's weights of [`WEIGHTS_FILE`], when the data dir has one.
    pub weights: Option<Weights>,
    /// The directory whose weights are read at start and at each reload.
    weights_dir: Option<PathBuf>,
}

impl ConfigFile {
    /// Defaults, as if `path` did not exist.
    pub fn defaults(path: PathBuf) -> ConfigFile {
        ConfigFile {
            path,
            servers: Vec::new(),
            router: RouterConfig::default(),
            explicit: false,
            weights: None,
            weights_dir: None,
        }
    }

    /// Reads and checks `path`. `explicit`: the user named it, so it must exist.
    pub fn load(path: &Path, explicit: bool) -> anyhow::Result<ConfigFile> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                return Ok(ConfigFile::defaults(path.to_path_buf()));
            }
            Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        };
        let file: File =
            toml::from_str(&text).with_context(|| format!("invalid {}", path.display()))?;
        let (servers, mut problems) = upstream::check_servers(file.servers);
        problems.extend(
            file.router
                .problems()
                .into_iter()
                .map(|p| format!("router: {p}")),
        );
        if !problems.is_empty() {
            anyhow::bail!("{}:\n  {}", path.display(), problems.join("\n  "));
        }
        Ok(ConfigFile {
            path: path.to_path_buf(),
            servers,
            router: file.router,
            explicit,
            weights: None,
            weights_dir: None,
        })
    }

    /// Also reads `dir`'s [`WEIGHTS_FILE`] (now and at each reload). A file that does
    /// not parse, or names a feature the scorer lacks, is an error, as a typo in the
    /// config is: routing must not fall back to other weights unnoticed.
    pub fn with_weights_from(mut self, dir: &Path) -> anyhow::Result<ConfigFile> {
        self.weights = read_weights(&dir.join(WEIGHTS_FILE))?;
        self.weights_dir = Some(dir.to_path_buf());
        Ok(self)
    }

    /// The weights every router built from this config scores with.
    pub fn router_weights(&self) -> Weights {
        self.weights.clone().unwrap_or_else(Weights::shipped)
    }

    /// A router over `registry` with this config's tunables and weights: every router
    /// an entry point builds comes from here.
    pub fn router(&self, registry: std::sync::Arc<loadout::Registry>) -> loadout_router::Router {
        let mut router = loadout_router::Router::new(registry, self.router.clone());
        if let Some(weights) = &self.weights {
            router.set_weights(weights.clone());
        }
        router
    }

    /// The file read again from where this one was read, checked as at start.
    pub fn reload(&self) -> anyhow::Result<ConfigFile> {
        let file = ConfigFile::load(&self.path, self.explicit)?;
        match &self.weights_dir {
            Some(dir) => file.with_weights_from(dir),
            None => Ok(file),
        }
    }

    /// The `[router]` fields whose values differ in `other`, as `name: old → new`.
    pub fn router_changes(&self, other: &ConfigFile) -> Vec<String> {
        let fields = |config: &RouterConfig| match serde_json::to_value(config) {
            Ok(serde_json::Value::Object(fields)) => fields,
            _ => serde_json::Map::new(),
        };
        let (old, new) = (fields(&self.router), fields(&other.router));
        let mut changes: Vec<String> = new
            .iter()
            .filter(|(name, value)| old.get(*name) != Some(value))
            .map(|(name, value)| {
                let was = old.get(name).unwrap_or(&serde_json::Value::Null);
                format!("{name}: {was} → {value}")
            })
            .collect();
        if self.weights != other.weights {
            let describe = |weights: &Option<Weights>| match weights {
                Some(weights) => format!("{WEIGHTS_FILE} ({})", fitted_on(weights)),
                None => "shipped".to_owned(),
            };
            changes.push(format!(
                "weights: {} → {}",
                describe(&self.weights),
                describe(&other.weights)
            ));
        }
        changes
    }
}

/// `path`'s weights; `None` when there is no such file.
fn read_weights(path: &Path) -> anyhow::Result<Option<Weights>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    };
    let weights: Weights = serde_json::from_str(&text).with_context(|| {
        format!(
            "invalid {} (remove it to route with the shipped weights)",
            path.display()
        )
    })?;
    let unknown = weights.unknown_features();
    if !unknown.is_empty() {
        anyhow::bail!(
            "{}: features the scorer does not have: {} (fitted by another version? run `loadout fit` again, or remove the file)",
            path.display(),
            unknown.join(", ")
        );
    }
    Ok(Some(weights))
}

/// When and on what the weights were fitted, as their file says.
pub fn fitted_on(weights: &Weights) -> String {
    let field = |name: &str| weights.fitted.get(name).and_then(|v| v.as_str());
    match (field("date"), field("cases")) {
        (Some(date), Some(cases)) => format!("fitted {date} on {cases}"),
        (Some(date), None) => format!("fitted {date}"),
        _ => "fitted".to_owned(),
    }
}

/// What a reload changed.
#[derive(Debug)]
pub struct Reloaded {
    /// `[router]` fields that changed, as `name: old → new`.
    pub router_changes: Vec<String>,
    /// `[servers]` changed: the MCP server connects and stops servers to match.
    pub servers_changed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> anyhow::Result<ConfigFile> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CONFIG_FILE);
        std::fs::write(&path, text).expect("write");
        ConfigFile::load(&path, true)
    }

    #[test]
    fn the_router_table_sets_some_fields_and_the_rest_keep_defaults() {
        let config = load(
            r#"
            [router]
            token_budget = 2500
            pin_on_tools = ["create_table", "remember"]
            [servers.time]
            command = "uvx"
            "#,
        )
        .expect("config");
        assert_eq!(config.router.token_budget, 2500);
        assert_eq!(config.router.pin_on_tools, ["create_table", "remember"]);
        assert_eq!(config.router.idle_turns, RouterConfig::default().idle_turns);
        assert_eq!(config.servers.len(), 1);
    }

    #[test]
    fn a_missing_file_is_defaults_only_when_nobody_named_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("missing.toml");
        let config = ConfigFile::load(&path, false).expect("defaults");
        assert_eq!(config.router, RouterConfig::default());
        assert!(config.servers.is_empty());
        let error = format!("{:#}", ConfigFile::load(&path, true).expect_err("named"));
        assert!(error.contains("missing.toml"), "{error}");
    }

    #[test]
    fn a_misspelt_or_mistyped_router_key_is_refused_by_name() {
        let error = format!(
            "{:#}",
            load("[router]\ntoken_budjet = 3000\n").expect_err("unknown key")
        );
        assert!(error.contains("token_budjet"), "{error}");
        assert!(error.contains(CONFIG_FILE), "{error}");

        let error = format!(
            "{:#}",
            load("[router]\ntoken_budget = \"lots\"\n").expect_err("wrong type")
        );
        assert!(error.contains("token_budget"), "{error}");

        let error = format!("{:#}", load("[routr]\n").expect_err("unknown table"));
        assert!(error.contains("routr"), "{error}");
    }

    #[test]
    fn router_and_server_problems_are_reported_together() {
        let error = format!(
            "{:#}",
            load(
                r#"
                [router]
                dense_floor = 0.8
                bm25_min_score = nan
                [servers.neither]
                "#
            )
            .expect_err("problems")
        );
        for expected in [
            "router: `dense_ceiling` (0.7) must be above `dense_floor` (0.8)",
            "router: `bm25_min_score` is NaN",
            "servers.neither:",
        ] {
            assert!(
                error.contains(expected),
                "{expected:?} missing from {error}"
            );
        }
    }

    #[test]
    fn a_reload_names_the_changed_router_fields_and_needs_a_named_file_still() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CONFIG_FILE);
        std::fs::write(&path, "[router]\ntoken_budget = 3000\n").expect("write");
        let running = ConfigFile::load(&path, true).expect("config");
        std::fs::write(
            &path,
            "[router]\ntoken_budget = 2500\npin_on_tools = [\"remember\"]\n",
        )
        .expect("write");
        let reloaded = running.reload().expect("reload");
        assert_eq!(reloaded.router.token_budget, 2500);
        let changes = running.router_changes(&reloaded);
        assert_eq!(
            changes,
            [
                "pin_on_tools: [] → [\"remember\"]",
                "token_budget: 3000 → 2500"
            ],
            "{changes:?}"
        );
        assert!(reloaded.router_changes(&reloaded).is_empty());

        std::fs::remove_file(&path).expect("remove");
        let error = format!("{:#}", running.reload().expect_err("named file gone"));
        assert!(error.contains(CONFIG_FILE), "{error}");
        // The default file gone means defaults again.
        let default = ConfigFile::load(&path, false).expect("defaults");
        assert_eq!(
            default.reload().expect("defaults").router,
            RouterConfig::default()
        );
    }

    /// Issue 37: `loadout fit` writes `weights.json` beside the data; a reload takes
    /// it (a change the reload names, so the router is rebuilt), and a broken file is
    /// refused with its name while the running config stays.
    #[test]
    fn a_reload_takes_the_fitted_weights_of_the_data_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let running = ConfigFile::load(&dir.path().join(CONFIG_FILE), false)
            .and_then(|c| c.with_weights_from(dir.path()))
            .expect("config");
        assert!(running.weights.is_none());
        assert_eq!(running.router_weights(), Weights::shipped());

        let mut fitted = Weights::shipped();
        fitted.lexical.bias -= 1.0;
        fitted.fitted = serde_json::json!({"date": "2026-11-27", "cases": "stored sessions"});
        let path = dir.path().join(WEIGHTS_FILE);
        std::fs::write(&path, serde_json::to_string(&fitted).expect("json")).expect("write");
        let reloaded = running.reload().expect("reload");
        assert_eq!(reloaded.router_weights(), fitted);
        assert_eq!(
            running.router_changes(&reloaded),
            ["weights: shipped → weights.json (fitted 2026-11-27 on stored sessions)"]
        );

        std::fs::write(&path, r#"{"lexical": {"bias": 0, "weights": {"no_such_feature": 1}, "selection": {"coverage": 0.9, "min_ratio": 0.1, "min_probability": 0.01, "whole_domain_ratio": 0.5, "whole_domain_share": 0.5}}, "dense": {"bias": 0, "weights": {}, "selection": {"coverage": 0.9, "min_ratio": 0.1, "min_probability": 0.01, "whole_domain_ratio": 0.5, "whole_domain_share": 0.5}}}"#).expect("write");
        let error = format!("{:#}", reloaded.reload().expect_err("unknown feature"));
        assert!(
            error.contains(WEIGHTS_FILE) && error.contains("no_such_feature"),
            "{error}"
        );
    }
}
