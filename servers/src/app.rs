//! What every entry point opens: the registry of linked domains, the store, the
//! settings cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use loadout::{Registry, Settings, Store, ToolContext};

#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
}

/// `~/.loadout`, or `./.loadout` when no home directory is known.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".loadout")
}

/// The process-wide state shared by every command and server.
#[derive(Clone, Debug)]
pub struct App {
    pub registry: Arc<Registry>,
    pub settings: Settings,
}

impl App {
    pub async fn open(config: &Config) -> anyhow::Result<App> {
        let registry = loadout_domains::registry().context("building the tool registry")?;
        let store = open_store(config.database_url.as_deref(), &config.data_dir).await?;
        Ok(App {
            registry: Arc::new(registry),
            settings: Settings::new(store),
        })
    }

    pub fn context(&self) -> ToolContext {
        ToolContext::new(self.registry.clone(), self.settings.clone())
    }
}

async fn open_store(url: Option<&str>, data_dir: &Path) -> anyhow::Result<Store> {
    Store::connect(url, data_dir).await.map_err(|e| anyhow::anyhow!("{e}"))
}
