//! Settings: key/value strings in the [`Storage`], read through a cache.
//!
//! Reads are served from memory; the cache is dropped by every write made through
//! this handle and reloaded when the store reports a write by anyone else, with a
//! TTL (default 10 s) as the backstop.
//!
//! How "a write by anyone else" is noticed depends on the backend. SQLite: the
//! store's [`settings_version`](Storage::settings_version) (a pragma, in process) is
//! asked on every [`snapshot`](Settings::snapshot), so a tool call sees a setting
//! another process (`loadout mcp`, the CLI) just wrote; the routing hot path uses
//! [`snapshot_recent`](Settings::snapshot_recent), which asks at most once per
//! [`RECHECK`], from one request at a time, so a busy server does not queue one
//! storage call per request.
//! PostgreSQL: the store's
//! listener ([`Storage::settings_changes`]) reports every write by any replica at once
//! (`LISTEN/NOTIFY`), so a snapshot asks the database nothing while the listener is
//! connected; a notification, a reconnect or a lost listener drops the cache, and
//! while the listener is down the epoch is asked on every read, as on SQLite.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::storage::{SettingsChange, Storage, StoreError};

pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// How long [`Settings::snapshot_recent`] trusts the cache on SQLite before asking
/// the store whether another process wrote. Writes through this handle never wait
/// for it.
pub const RECHECK: Duration = Duration::from_millis(50);

/// Cached view of the settings table; cheap to clone, clones share the cache.
#[derive(Clone, Debug)]
pub struct Settings {
    store: Arc<dyn Storage>,
    ttl: Duration,
    cache: Arc<Mutex<Option<Cached>>>,
    /// The store's change notifications, where it has them.
    changes: Option<watch::Receiver<SettingsChange>>,
    /// Set while one [`Settings::snapshot_recent`] asks the store.
    asking: Arc<AtomicBool>,
}

/// The right to ask the store on behalf of every `snapshot_recent` caller; given
/// back when dropped, also when the asking future is cancelled or fails.
struct Asking<'a>(&'a AtomicBool);

impl<'a> Asking<'a> {
    fn start(flag: &'a AtomicBool) -> Option<Asking<'a>> {
        (!flag.swap(true, Ordering::AcqRel)).then_some(Asking(flag))
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[derive(Debug)]
struct Cached {
    loaded: Instant,
    /// When the store last confirmed `version` (SQLite).
    checked: Instant,
    version: i64,
    /// The listener's generation when the map was loaded (0 without a listener).
    generation: u64,
    values: Arc<BTreeMap<String, String>>,
}

impl Settings {
    pub fn new(store: impl Storage) -> Settings {
        Settings::with_ttl(store, DEFAULT_TTL)
    }

    pub fn with_ttl(store: impl Storage, ttl: Duration) -> Settings {
        let store: Arc<dyn Storage> = Arc::new(store);
        let changes = store.settings_changes();
        Settings {
            store,
            ttl,
            cache: Arc::new(Mutex::new(None)),
            changes,
            asking: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.store
    }

    /// All settings. Served from the cache while it is fresh and nobody has written
    /// since it was loaded.
    pub async fn snapshot(&self) -> Result<Arc<BTreeMap<String, String>>, StoreError> {
        self.snapshot_checked(false).await
    }

    /// Like [`snapshot`](Self::snapshot), but on SQLite a write by another process
    /// may take up to [`RECHECK`] to be seen: for routing, where a setting that is a
    /// few milliseconds late costs nothing and a storage call per message does.
    pub async fn snapshot_recent(&self) -> Result<Arc<BTreeMap<String, String>>, StoreError> {
        self.snapshot_checked(true).await
    }

    async fn snapshot_checked(
        &self,
        allow_recent: bool,
    ) -> Result<Arc<BTreeMap<String, String>>, StoreError> {
        let change = self.change();
        // (version, within the TTL, confirmed within RECHECK, values)
        let current = self
            .lock()
            .as_ref()
            .filter(|c| c.generation == change.generation)
            .map(|c| {
                (
                    c.version,
                    c.loaded.elapsed() < self.ttl,
                    c.checked.elapsed() < RECHECK,
                    c.values.clone(),
                )
            });
        // Routing asks the store from one request at a time: the others take the map
        // that was current a moment ago instead of queueing on the connection behind
        // it (on SQLite, a burst of requests once per RECHECK and per TTL).
        let mut _asking = None;
        if allow_recent && let Some((_, live, fresh, values)) = &current {
            if *live && *fresh {
                return Ok(values.clone());
            }
            match Asking::start(&self.asking) {
                Some(asking) => _asking = Some(asking),
                None => return Ok(values.clone()),
            }
        }
        let cached = current
            .filter(|(_, live, _, _)| *live)
            .map(|(version, _, _, values)| (version, values));
        if change.listening {
            // Every write by anyone changes the generation: no need to ask the store.
            if let Some((_, values)) = cached {
                return Ok(values);
            }
            let values = Arc::new(self.store.settings_all().await?);
            // A notification that arrived while loading makes the next read reload.
            self.store_cache(i64::MIN, change.generation, values.clone());
            return Ok(values);
        }
        let version = self.store.settings_version().await?;
        if let Some((cached_version, values)) = cached
            && cached_version == version
        {
            if let Some(c) = self.lock().as_mut()
                && c.version == version
            {
                c.checked = Instant::now();
            }
            return Ok(values);
        }
        let values = Arc::new(self.store.settings_all().await?);
        // Read the version again after loading: a write in between makes the next
        // read reload rather than trust a stale map.
        let version_after = self.store.settings_version().await?;
        let version = if version_after == version {
            version
        } else {
            i64::MIN
        };
        self.store_cache(version, change.generation, values.clone());
        Ok(values)
    }

    fn store_cache(&self, version: i64, generation: u64, values: Arc<BTreeMap<String, String>>) {
        let now = Instant::now();
        *self.lock() = Some(Cached {
            loaded: now,
            checked: now,
            version,
            generation,
            values,
        });
    }

    /// What the store's listener reports now (never listening without one).
    fn change(&self) -> SettingsChange {
        self.changes
            .as_ref()
            .map(|rx| *rx.borrow())
            .unwrap_or_default()
    }

    /// The cached map without asking the store: for the routing hot path, which
    /// must not wait on storage. `None` until the first [`snapshot`](Self::snapshot),
    /// after the TTL, and once a write by anyone has been notified.
    pub fn cached(&self) -> Option<Arc<BTreeMap<String, String>>> {
        let generation = self.change().generation;
        self.lock()
            .as_ref()
            .filter(|c| c.loaded.elapsed() < self.ttl && c.generation == generation)
            .map(|c| c.values.clone())
    }

    pub async fn get(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self.snapshot().await?.get(key).cloned())
    }

    /// Writes a setting after checking the value against the key's declaration
    /// ([`check_setting`](crate::check_setting)); a refused value is
    /// [`StoreError::Invalid`] with the reason. The caller has checked who sets it.
    pub async fn set(&self, key: &str, value: &str) -> Result<(), StoreError> {
        crate::check_setting(key, Some(value), crate::Setter::Operator)
            .map_err(|refused| StoreError::Invalid(refused.to_string()))?;
        self.store.setting_set(key, value).await?;
        self.invalidate();
        Ok(())
    }

    pub async fn unset(&self, key: &str) -> Result<bool, StoreError> {
        let existed = self.store.setting_unset(key).await?;
        self.invalidate();
        Ok(existed)
    }

    /// Drops the cache; the next read goes to the store.
    pub fn invalidate(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Cached>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Setting keys are lowercase identifiers: they appear in error messages and URLs.
pub fn validate_setting_key(key: &str) -> Result<(), StoreError> {
    let ok = !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "setting key `{}` must be 1-128 characters of a-z, 0-9, `_` or `.`",
            key.chars().take(80).collect::<String>()
        )))
    }
}

/// Whether a key names a secret whose value must be masked when read back.
pub fn is_secret_key(key: &str) -> bool {
    const MARKERS: &[&str] = &[
        "key",
        "token",
        "secret",
        "password",
        "passwd",
        "credential",
        "auth",
        "cookie",
        "private",
    ];
    let key = key.to_ascii_lowercase();
    MARKERS.iter().any(|m| key.contains(m))
}

/// A masked form that shows the value is set without revealing it.
pub fn mask_secret(value: &str) -> String {
    let n = value.chars().count();
    if n <= 8 {
        "********".into()
    } else {
        let tail: String = value.chars().skip(n - 4).collect();
        format!("********{tail}")
    }
}

/// Masks secret-looking values anywhere inside a JSON value (for audit logs). Only
/// values are masked: a field named `key` holds a setting's name (`set_setting`,
/// `get_setting`), which stays readable although the word `key` marks a secret in
/// a field's name (`api_key`).
pub fn mask_json_secrets(value: &serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            // `{"key": "llm_api_key", "value": "sk-…"}` (set_setting) hides its secret
            // under a harmless field name.
            let value_is_secret = map
                .get("key")
                .and_then(serde_json::Value::as_str)
                .is_some_and(is_secret_key);
            serde_json::Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let masked = match v {
                            serde_json::Value::String(s)
                                if (k != "key" && is_secret_key(k))
                                    || (value_is_secret && k == "value") =>
                            {
                                serde_json::Value::String(mask_secret(s))
                            }
                            other => mask_json_secrets(other),
                        };
                        (k.clone(), masked)
                    })
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.iter().map(mask_json_secrets).collect())
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys_are_recognised() {
        assert!(is_secret_key("openweathermap_api_key"));
        assert!(is_secret_key("llm_api_key"));
        assert!(is_secret_key("github_token"));
        assert!(!is_secret_key("filesystem_roots"));
        assert!(!is_secret_key("llm_model"));
    }

    #[test]
    fn masking_keeps_only_a_short_tail() {
        assert_eq!(mask_secret("short"), "********");
        assert_eq!(mask_secret("sk-abcdefghijkl"), "********ijkl");
        let masked = mask_json_secrets(
            &serde_json::json!({"key": "llm_api_key", "value": "x", "api_key": "sk-123456789"}),
        );
        assert_eq!(masked["api_key"], "********6789");
        assert_eq!(masked["value"], "********");
    }

    #[test]
    fn setting_names_stay_readable_only_secret_values_are_masked() {
        let secret = mask_json_secrets(
            &serde_json::json!({"key": "llm_api_key", "value": "sk-123456789abcdef"}),
        );
        assert_eq!(secret["key"], "llm_api_key");
        assert_eq!(secret["value"], "********cdef");
        let plain = mask_json_secrets(
            &serde_json::json!({"key": "filesystem_roots", "value": "/srv/data"}),
        );
        assert_eq!(plain["key"], "filesystem_roots");
        assert_eq!(plain["value"], "/srv/data");
    }
}
