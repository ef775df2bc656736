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
use serde::Deserialize;

use crate::mcp::upstream::{self, ServerConfig};

/// The config file's name in the data dir.
pub const CONFIG_FILE: &str = "loadout.toml";

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
}

impl ConfigFile {
    /// Defaults, as if `path` did not exist.
    pub fn defaults(path: PathBuf) -> ConfigFile {
        ConfigFile {
            path,
            servers: Vec::new(),
            router: RouterConfig::default(),
            explicit: false,
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
        })
    }

    /// The file read again from where this one was read, checked as at start.
    pub fn reload(&self) -> anyhow::Result<ConfigFile> {
        ConfigFile::load(&self.path, self.explicit)
    }

    /// The `[router]` fields whose values differ in `other`, as `name: old → new`.
    pub fn router_changes(&self, other: &ConfigFile) -> Vec<String> {
        let fields = |config: &RouterConfig| match serde_json::to_value(config) {
            Ok(serde_json::Value::Object(fields)) => fields,
            _ => serde_json::Map::new(),
        };
        let (old, new) = (fields(&self.router), fields(&other.router));
        new.iter()
            .filter(|(name, value)| old.get(*name) != Some(value))
            .map(|(name, value)| {
                let was = old.get(name).unwrap_or(&serde_json::Value::Null);
                format!("{name}: {was} → {value}")
            })
            .collect()
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
}
