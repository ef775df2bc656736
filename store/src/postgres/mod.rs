//! The PostgreSQL backend: what several replicas of `loadout serve` / `loadout mcp`
//! share.
//!
//! - Connections come from a pool (`deadpool-postgres` over `tokio-postgres`) that
//!   replaces broken connections by itself: when the server goes away, operations
//!   fail with [`StoreError::Unavailable`], and succeed again once it is back,
//!   without rebuilding the [`Store`](super::Store).
//! - Connections are plain TCP or Unix sockets (`NoTls`): run PostgreSQL on a
//!   trusted network or loopback; a URL asking for `sslmode=require` is refused
//!   when connecting.
//! - Split by concern as SQLite's: [`migrations`], [`settings`] (with the
//!   [`listener`] that reports every replica's writes), [`sessions`], [`decisions`],
//!   [`audit`].

mod audit;
mod clients;
mod decisions;
mod learned;
mod listener;
mod memory;
mod migrations;
pub mod scratchpad;
mod sessions;
mod settings;

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
};
use tokio_postgres::NoTls;

use listener::SettingsListener;
pub use migrations::SCHEMA_VERSION;
use migrations::{MigrateError, migrate};

use crate::{StoreError, mask_url_password};

/// The channel settings writes notify on.
pub const SETTINGS_CHANNEL: &str = "loadout_settings";

/// Advisory lock key (arbitrary, fixed) of domain schemas.
const DOMAIN_SCHEMA_LOCK: i64 = 0x6c6f_6164_6f75_7402;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_SIZE: usize = 16;
/// How long a request waits for a free connection before it is told the database
/// is unavailable.
const POOL_WAIT: Duration = Duration::from_secs(10);

/// PostgreSQL state backend.
pub struct PostgresStore {
    pool: Pool,
    url_masked: String,
    listener: SettingsListener,
    /// Domain schemas already ensured through this store (see [`Self::ensure_schema`]).
    ensured: Mutex<HashSet<&'static str>>,
}

impl PostgresStore {
    /// Connects, checks the server is reachable and brings the schema up to date.
    /// An unreachable server is [`StoreError::Open`] naming the URL, password masked.
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let url_masked = mask_url_password(url);
        let mut config: tokio_postgres::Config =
            url.parse()
                .map_err(|e: tokio_postgres::Error| StoreError::BadUrl {
                    url: url_masked.clone(),
                    reason: error_chain(&e),
                })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("loadout");
        }
        // Notice a silently dead peer (no FIN) within about a minute.
        config.keepalives_idle(Duration::from_secs(30));

        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(CONNECT_TIMEOUT + Duration::from_secs(1)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| StoreError::Open {
                url: url_masked.clone(),
                message: e.to_string(),
            })?;
        let mut client = pool.get().await.map_err(|e| StoreError::Open {
            url: url_masked.clone(),
            message: describe_pool_error(&e),
        })?;
        migrate(&mut client).await.map_err(|e| match e {
            MigrateError::Store(e) => e,
            MigrateError::Pg(e) => StoreError::Open {
                url: url_masked.clone(),
                message: format!("cannot apply migrations: {}", error_chain(&e)),
            },
        })?;
        drop(client);
        let listener = SettingsListener::spawn(config, url_masked.clone());
        Ok(PostgresStore {
            pool,
            url_masked,
            listener,
            ensured: Mutex::new(HashSet::new()),
        })
    }

    /// The URL with its password masked.
    pub fn url_masked(&self) -> &str {
        &self.url_masked
    }

    /// A pooled connection, for domains that keep their own tables. Broken
    /// connections are replaced by the pool; while the server is down this is
    /// [`StoreError::Unavailable`].
    pub async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot reach PostgreSQL at {}: {}",
                self.url_masked,
                describe_pool_error(&e)
            ))
        })
    }

    /// Converts a driver error: connection failures become
    /// [`StoreError::Unavailable`] naming the server, the rest
    /// [`StoreError::Database`] with the server's message.
    pub fn error(&self, e: tokio_postgres::Error) -> StoreError {
        if is_connection_error(&e) {
            StoreError::Unavailable(format!(
                "lost the connection to PostgreSQL at {}: {}",
                self.url_masked,
                error_chain(&e)
            ))
        } else {
            StoreError::Database(describe_error(&e))
        }
    }

    /// Runs `sql` (idempotent DDL: `CREATE … IF NOT EXISTS`) once per store under
    /// an advisory lock, so that replicas creating a domain's tables together do not
    /// race. `name` identifies the schema and its version, e.g. `memory/1`.
    pub async fn ensure_schema(&self, name: &'static str, sql: &str) -> Result<(), StoreError> {
        if self.ensured_lock().contains(name) {
            return Ok(());
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&DOMAIN_SCHEMA_LOCK])
            .await
            .map_err(|e| self.error(e))?;
        tx.batch_execute(sql).await.map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))?;
        self.ensured_lock().insert(name);
        Ok(())
    }

    fn ensured_lock(&self) -> std::sync::MutexGuard<'_, HashSet<&'static str>> {
        self.ensured.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The rows `sql` returns for the newest `n` rows (`$1`), each made by `row`.
    async fn newest<T>(
        &self,
        sql: &str,
        n: usize,
        row: impl Fn(&tokio_postgres::Row) -> Result<T, tokio_postgres::Error>,
    ) -> Result<Vec<T>, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let rows = self.query(sql, &[&n]).await?;
        rows.iter()
            .map(row)
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        client
            .execute(&stmt, params)
            .await
            .map_err(|e| self.error(e))
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        client.query(&stmt, params).await.map_err(|e| self.error(e))
    }

    async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        client
            .query_opt(&stmt, params)
            .await
            .map_err(|e| self.error(e))
    }

    async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        client
            .query_one(&stmt, params)
            .await
            .map_err(|e| self.error(e))
    }
}

/// PostgreSQL text cannot hold NUL characters: log rows (decisions, audit) keep
/// them as U+FFFD rather than failing to be written.
fn without_nul(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{fffd}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// Whether an error means the server could not be reached or the connection broke
/// (as opposed to an error the server reported about a statement).
pub fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        // Class 08: connection exception; 57P01-03: shutdown, crash, cannot connect now.
        return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03");
    }
    let message = e.to_string();
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        || message.starts_with("error communicating")
        || message.starts_with("error connecting")
        || message.starts_with("timeout")
}

/// The server's message for a statement error (with detail and hint), or the
/// driver's error chain.
pub fn describe_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut message = db.message().to_owned();
            if let Some(detail) = db.detail() {
                message.push_str(&format!(" ({detail})"));
            }
            if let Some(hint) = db.hint() {
                message.push_str(&format!("; hint: {hint}"));
            }
            message
        }
        None => error_chain(e),
    }
}

/// An error and its causes, `: `-separated (the driver's own Display omits causes).
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

fn describe_pool_error(e: &PoolError) -> String {
    match e {
        PoolError::Backend(e) => error_chain(e),
        PoolError::Timeout(kind) => format!("timed out ({kind:?}) waiting for a connection"),
        other => other.to_string(),
    }
}

/// Runs a log write, and once more after [`crate::RETRY_AFTER`] if it fails.
async fn retry_once<F, W>(write: W) -> Result<(), StoreError>
where
    W: Fn() -> F,
    F: std::future::Future<Output = Result<(), StoreError>>,
{
    match write().await {
        Err(e) => {
            tracing::debug!("log write failed, retrying: {e}");
            tokio::time::sleep(crate::RETRY_AFTER).await;
            write().await
        }
        ok => ok,
    }
}
