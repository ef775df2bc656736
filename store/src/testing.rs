//! The backends the storage and domain test suites run against, so that one test
//! body covers every engine. Not part of the API; used by `#[cfg(test)]` code in
//! this crate and in domain crates.
//!
//! SQLite always runs. PostgreSQL runs when `LOADOUT_TEST_POSTGRES_URL` names a
//! server (`scripts/ci-postgres.sh` prints one): each test store gets a fresh
//! database of its own (the role needs `CREATEDB`), dropped in the background when
//! the store is. Databases left behind (the process exited first, or was killed)
//! are dropped by the next run.
//!
//! Tests that stop the server (`LOADOUT_TEST_PG_STOP_CMD`) take the server lock
//! exclusively, so that no other test of the same process runs against it then.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use tokio::sync::{OnceCell, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};
use tokio_postgres::NoTls;

use super::Store;

/// Names the PostgreSQL server to test against (a URL whose role may create databases).
pub const POSTGRES_URL_VAR: &str = "LOADOUT_TEST_POSTGRES_URL";
/// Shell commands that stop and start that server (for the reconnect test).
pub const POSTGRES_STOP_VAR: &str = "LOADOUT_TEST_PG_STOP_CMD";
pub const POSTGRES_START_VAR: &str = "LOADOUT_TEST_PG_START_CMD";

const DATABASE_PREFIX: &str = "loadout_t_";

static SERVER_LOCK: LazyLock<Arc<RwLock<()>>> = LazyLock::new(|| Arc::new(RwLock::new(())));
static STALE_DROPPED: OnceCell<()> = OnceCell::const_new();
static N_DATABASES: AtomicU64 = AtomicU64::new(0);

/// A store on one backend, with what is needed to open it again.
pub struct TestStore {
    /// `sqlite` or `postgres`, for assertion messages.
    pub name: &'static str,
    pub store: Store,
    /// The database URL (`sqlite:PATH` or `postgres://…`), to open a second store
    /// on the same data.
    pub url: String,
    pub data_dir: PathBuf,
    // Dropped after `store` (fields drop in declaration order).
    database: Option<TestDatabase>,
    _server: ServerGuard,
}

enum ServerGuard {
    None,
    Shared(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
    Exclusive(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
}

impl TestStore {
    /// Another [`Store`] on the same database, as a second process or replica would
    /// open it.
    pub async fn reopen(&self) -> Result<Store, super::StoreError> {
        Store::connect(Some(&self.url), &self.data_dir).await
    }

    pub fn is_postgres(&self) -> bool {
        self.database.is_some()
    }
}

/// The URL of the PostgreSQL server to test against, if any. Under CI (`CI=true`)
/// a missing URL panics: CI runs `scripts/ci-postgres.sh`, and a PostgreSQL suite
/// that skips there would pass without covering the backend it exists for.
pub fn postgres_url() -> Option<String> {
    let url = std::env::var(POSTGRES_URL_VAR)
        .ok()
        .filter(|url| !url.trim().is_empty());
    if url.is_none() && std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "CI=true but {POSTGRES_URL_VAR} is unset: run `eval \"$(bash scripts/ci-postgres.sh)\"` first"
        );
    }
    url
}

/// One store per backend to test: SQLite in `data_dir/sqlite`, and PostgreSQL in a
/// fresh database when [`POSTGRES_URL_VAR`] is set. Panics with a clear message
/// when the PostgreSQL server is named but cannot be used: a test must not pass by
/// silently skipping the backend it was asked to cover.
pub async fn test_stores(data_dir: &Path) -> Vec<TestStore> {
    let mut stores = vec![sqlite_store(data_dir).await];
    if let Some(admin_url) = postgres_url() {
        let guard = SERVER_LOCK.clone().read_owned().await;
        stores.push(postgres_store(&admin_url, data_dir, ServerGuard::Shared(guard)).await);
    }
    stores
}

/// A PostgreSQL store whose holder may stop and start the server: no other test
/// of this process uses the server meanwhile. `None` without a server to test.
pub async fn postgres_store_exclusive(data_dir: &Path) -> Option<TestStore> {
    let admin_url = postgres_url()?;
    let guard = SERVER_LOCK.clone().write_owned().await;
    Some(postgres_store(&admin_url, data_dir, ServerGuard::Exclusive(guard)).await)
}

async fn sqlite_store(data_dir: &Path) -> TestStore {
    let dir = data_dir.join("sqlite");
    let url = format!("sqlite:{}", dir.join("loadout.db").display());
    let store = match Store::connect(Some(&url), &dir).await {
        Ok(store) => store,
        Err(e) => panic!("cannot open the SQLite test store: {e}"),
    };
    TestStore {
        name: "sqlite",
        store,
        url,
        data_dir: dir,
        database: None,
        _server: ServerGuard::None,
    }
}

async fn postgres_store(admin_url: &str, data_dir: &Path, server: ServerGuard) -> TestStore {
    let database = match TestDatabase::create(admin_url).await {
        Ok(database) => database,
        Err(e) => panic!(
            "{POSTGRES_URL_VAR} is set but no test database could be created on {}: {e}",
            super::mask_url_password(admin_url)
        ),
    };
    let dir = data_dir.join("postgres");
    let store = match Store::connect(Some(&database.url), &dir).await {
        Ok(store) => store,
        Err(e) => panic!("cannot open the PostgreSQL test store: {e}"),
    };
    TestStore {
        name: "postgres",
        store,
        url: database.url.clone(),
        data_dir: dir,
        database: Some(database),
        _server: server,
    }
}

/// A database made for one test; dropped (with its connections) when this is.
struct TestDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl TestDatabase {
    async fn create(admin_url: &str) -> Result<TestDatabase, String> {
        let client = admin_client(admin_url).await?;
        STALE_DROPPED
            .get_or_init(|| drop_stale_databases(&client))
            .await;
        let name = format!(
            "{DATABASE_PREFIX}{}_{}",
            std::process::id(),
            N_DATABASES.fetch_add(1, Ordering::Relaxed)
        );
        client
            .batch_execute(&format!(
                "CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8'"
            ))
            .await
            .map_err(|e| super::postgres::describe_error(&e))?;
        let url = with_database(admin_url, &name)
            .ok_or_else(|| "the URL must have the form postgres://…/DATABASE".to_owned())?;
        Ok(TestDatabase {
            admin_url: admin_url.to_owned(),
            name,
            url,
        })
    }
}

impl Drop for TestDatabase {
    /// Drops the database from a detached thread. Joining it could stall: the test's
    /// runtime would be blocked, and a connection it had half opened (a listener
    /// reconnecting) would hold up `DROP DATABASE` until the server's authentication
    /// timeout. A database whose drop did not finish before the process exited is
    /// dropped by the next run ([`drop_stale_databases`]).
    fn drop(&mut self) {
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(client) = admin_client(&admin_url).await {
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                        .await;
                }
            });
        });
    }
}

async fn admin_client(admin_url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = tokio_postgres::connect(admin_url, NoTls)
        .await
        .map_err(|e| super::postgres::describe_error(&e))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Drops test databases whose process is gone (killed runs leave them behind).
async fn drop_stale_databases(client: &tokio_postgres::Client) {
    let Ok(rows) = client
        .query(
            "SELECT datname FROM pg_database WHERE starts_with(datname, $1)",
            &[&DATABASE_PREFIX],
        )
        .await
    else {
        return;
    };
    for row in rows {
        let Ok(name) = row.try_get::<_, String>(0) else {
            continue;
        };
        let pid = name
            .strip_prefix(DATABASE_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let alive = pid.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = client
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await;
        }
    }
}

/// The same URL naming another database.
fn with_database(url: &str, database: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let authority = rest
        .split_once('/')
        .map_or(rest, |(authority, _)| authority);
    let mut out = format!("{scheme}://{authority}/{database}");
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    Some(out)
}

/// A PostgreSQL store whose server the test may stop ([`Outage::stop`]): the server
/// lock is held exclusively, so no other test of the process runs against it then.
/// `None`, with a note naming `test`, when no server or no stop/start commands are
/// configured.
pub async fn postgres_outage_store(data_dir: &Path, test: &str) -> Option<(TestStore, Outage)> {
    if std::env::var(POSTGRES_STOP_VAR).is_err() || std::env::var(POSTGRES_START_VAR).is_err() {
        eprintln!("note: {POSTGRES_STOP_VAR} / {POSTGRES_START_VAR} unset; {test} skipped");
        return None;
    }
    let Some(store) = postgres_store_exclusive(data_dir).await else {
        eprintln!("note: {POSTGRES_URL_VAR} unset; {test} skipped");
        return None;
    };
    Some((store, Outage { stopped: false }))
}

/// Stops the test PostgreSQL server on request and starts it again when dropped,
/// whatever happens in between, for the tests that run after.
#[derive(Debug)]
pub struct Outage {
    stopped: bool,
}

impl Outage {
    /// Stops the server; panics when the stop command fails.
    pub fn stop(&mut self) {
        self.stopped = true;
        if let Some(Err(e)) = run_env_command(POSTGRES_STOP_VAR) {
            panic!("cannot stop PostgreSQL: {e}");
        }
    }

    /// Starts the server again, if it was stopped (also done on drop).
    pub fn end(&mut self) {
        if std::mem::take(&mut self.stopped)
            && let Some(Err(e)) = run_env_command(POSTGRES_START_VAR)
        {
            eprintln!("cannot restart PostgreSQL: {e}");
        }
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        self.end();
    }
}

/// Runs a shell command from an environment variable; `None` when it is unset.
pub fn run_env_command(var: &str) -> Option<Result<(), String>> {
    let command = std::env::var(var).ok().filter(|c| !c.trim().is_empty())?;
    let output = std::process::Command::new("sh")
        .arg("-c")
        .arg(&command)
        .output();
    Some(match output {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(format!(
            "`{command}` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run `{command}`: {e}")),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_are_pointed_at_another_database() {
        assert_eq!(
            super::with_database("postgres://u:p@h:5433/main?sslmode=disable", "t1").as_deref(),
            Some("postgres://u:p@h:5433/t1?sslmode=disable")
        );
        assert_eq!(
            super::with_database("postgresql://h", "t2").as_deref(),
            Some("postgresql://h/t2")
        );
        assert_eq!(super::with_database("host=h dbname=x", "t3"), None);
    }
}
