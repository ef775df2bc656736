//! The embedded SQLite backend: one file, WAL, a busy timeout so that the chat
//! server and an MCP server can share it; the decision log in a second file.
//!
//! Two connections, each owned by a thread of its own ([`connection`]): one for
//! requests and one for the background log writer and WAL checkpoints, so that a
//! batch of log rows never holds the lock routing and tool calls wait on.

mod audit;
mod clients;
mod connection;
mod decisions;
mod integrity;
mod learned;
mod memory;
mod migrations;
pub mod scratchpad;
mod sessions;
mod settings;

use std::path::{Path, PathBuf};

use rusqlite::Connection;

pub use connection::configure;
use connection::{ConnectionThread, LOG_AUTOCHECKPOINT_PAGES};
pub use migrations::SCHEMA_VERSION;
use migrations::{MIGRATIONS, attach, attach_decisions, check_version, migrate};

use crate::StoreError;

/// Schema name of the decision log's file, attached to both connections.
///
/// The decision log (`tool_history`, a row per routed message) lives in a file of its
/// own, written without `fsync`: in one file with the rest, each checkpoint synced
/// the log's pages with the settings and sessions. A crash of the process loses
/// nothing SQLite committed (the WAL is in the page cache); a power cut may lose the
/// last seconds of decisions, or leave the file unreadable, in which case it is
/// moved aside at the next start. Settings, sessions, memories and the audit log stay
/// in the main file with `synchronous = NORMAL`.
const DECISIONS: &str = "decisions";

/// The decision log's file next to the main one: `loadout.db` → `loadout.decisions.db`.
pub fn decisions_path(path: &Path) -> PathBuf {
    path.with_extension(format!("{DECISIONS}.db"))
}

/// What a job on a connection can fail with: a driver error, or the store's own.
/// `?` takes both inside a job; [`SqliteStore::call`] answers a [`StoreError`].
#[derive(Debug)]
pub enum Error {
    Sql(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Sql(e)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Error::Store(e)
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        use rusqlite::ErrorCode::{DatabaseBusy, DatabaseLocked};
        match e {
            Error::Store(e) => e,
            // Another process held the file past the busy timeout: worth a retry.
            Error::Sql(e) => match e.sqlite_error_code() {
                Some(DatabaseBusy | DatabaseLocked) => StoreError::Unavailable(e.to_string()),
                // Not an outage: retrying will not help, restoring will.
                Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                    StoreError::Database(format!(
                        "the database file is damaged ({e}): stop loadout and restore it from a backup, or recover it with `sqlite3 FILE .recover` (README, Crash safety)"
                    ))
                }
                _ => StoreError::Database(e.to_string()),
            },
        }
    }
}

/// SQLite state backend.
#[derive(Clone)]
pub struct SqliteStore {
    path: PathBuf,
    /// The connection for requests.
    conn: ConnectionThread,
    /// The background log writer's connection.
    log_conn: ConnectionThread,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let path = path.to_path_buf();
        let opened = path.clone();
        let (conn, log_conn) =
            tokio::task::spawn_blocking(move || -> Result<(Connection, Connection), StoreError> {
                let open_err = |e: &dyn std::fmt::Display| StoreError::Open {
                    url: format!("sqlite:{}", opened.display()),
                    message: e.to_string(),
                };
                if let Some(parent) = opened.parent()
                    && !parent.as_os_str().is_empty()
                {
                    private_dir(parent).map_err(|e| open_err(&e))?;
                }
                // A file that lost its contents is refused before SQLite opens it
                // (and would initialize an empty one in its place).
                let verdict = integrity::inspect(&opened)
                    .map_err(|what| open_err(&integrity::refusal(&opened, &what)))?;
                let mut conn = Connection::open(&opened).map_err(|e| open_err(&e))?;
                if let Err(e) = configure(&conn) {
                    // A schema larger than its first page is read from pages a cut
                    // may have taken: the first statement already fails.
                    if let integrity::Verdict::CheckWhenOpen(what) = &verdict {
                        let what = format!("{what}, and SQLite finds it damaged ({e})");
                        return Err(open_err(&integrity::refusal(&opened, &what)));
                    }
                    return Err(open_err(&e));
                }
                if let integrity::Verdict::CheckWhenOpen(what) = verdict {
                    let check: String = conn
                        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
                        .unwrap_or_else(|e| e.to_string());
                    if check != "ok" {
                        let what = format!("{what}, and SQLite finds it damaged ({check})");
                        return Err(open_err(&integrity::refusal(&opened, &what)));
                    }
                }
                // A transaction that reads before it writes (remember: is this a
                // duplicate?) would, begun deferred, be refused at once with "database
                // is locked" when another connection committed in between; begun
                // IMMEDIATE it takes the write lock first and waits (busy_timeout).
                conn.set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
                // Checkpoints run on the log connection, not inside a request's
                // commit, where copying the WAL back stalled it.
                conn.pragma_update(None, "wal_autocheckpoint", 0)
                    .map_err(|e| open_err(&e))?;
                // Refuse a newer main schema before touching the log's file.
                check_version(&conn, "main", SCHEMA_VERSION)?;
                attach_decisions(&mut conn, &opened)?;
                migrate(&mut conn, "main", MIGRATIONS, SCHEMA_VERSION)?;
                // The files hold credentials and conversations: their user's only,
                // also when an older loadout or another umask created them.
                private_files(&opened).map_err(|e| open_err(&e))?;
                let log_conn = Connection::open(&opened).map_err(|e| open_err(&e))?;
                configure(&log_conn).map_err(|e| open_err(&e))?;
                attach(&log_conn, &decisions_path(&opened)).map_err(|e| open_err(&e))?;
                log_conn
                    .pragma_update(None, "wal_autocheckpoint", LOG_AUTOCHECKPOINT_PAGES)
                    .map_err(|e| open_err(&e))?;
                Ok((conn, log_conn))
            })
            .await
            .map_err(|e| StoreError::Database(e.to_string()))??;
        let log_conn = ConnectionThread::start("loadout-sqlite-log", log_conn, None)?;
        log_conn.spawn_checkpoints();
        // The request thread keeps a handle on the log thread until its own
        // connection has closed, so that the log connection always closes last: the
        // last connection to close checkpoints the WAL and deletes it, and two
        // closing at once can each see the other open and leave the WAL behind.
        let conn = ConnectionThread::start("loadout-db", conn, Some(log_conn.clone()))?;
        Ok(SqliteStore {
            path,
            conn,
            log_conn,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the request connection, on its thread. Domains use this for their
    /// own tables in the shared database.
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection) -> Result<R, Error> + Send + 'static,
        R: Send + 'static,
    {
        self.conn.run(f).await
    }

    /// Like [`call`](Self::call), on the log writer's connection.
    async fn call_log<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection) -> Result<R, Error> + Send + 'static,
        R: Send + 'static,
    {
        self.log_conn.run(f).await
    }
}

/// Creates `dir` and its missing parents readable by their user only (0700); an
/// existing folder is left as it is, since the operator may share it on purpose.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Makes the database's files (main, decision log, their WAL and shared memory)
/// readable and writable by their user only (0600).
fn private_files(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let decisions = decisions_path(path);
    for base in [path, decisions.as_path()] {
        for suffix in ["", "-wal", "-shm"] {
            let mut name = base.as_os_str().to_owned();
            name.push(suffix);
            let file = PathBuf::from(name);
            match std::fs::metadata(&file) {
                Ok(metadata) if metadata.permissions().mode() & 0o077 != 0 => {
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
