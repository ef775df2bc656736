//! The SQLite connections: each owned by an OS thread of its own that runs the jobs
//! sent to it in arrival order, and the periodic WAL checkpoint.

use std::sync::Arc;

use rusqlite::Connection;

use super::Error;
use crate::StoreError;

/// How often the WAL is copied back into the database file: small and frequent
/// checkpoints stall the process least (see docs/performance.md).
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// WAL pages after which the log connection checkpoints on its own commit even
/// before the timer (SQLite's default).
pub(super) const LOG_AUTOCHECKPOINT_PAGES: i64 = 1_000;

/// Pragmas every connection to a shared file needs.
pub fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Every statement of the store stays prepared (rusqlite keeps 16 by default).
    conn.set_prepared_statement_cache_capacity(64);
    // The bundled SQLite has STAT4, under which a statement comparing a bound value
    // with an indexed column is compiled again whenever the value changes. Our
    // queries have one right plan.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// A job for a [`ConnectionThread`].
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// A connection owned by one OS thread that runs the jobs sent to it, in arrival
/// order; the thread ends when the last sender is gone (the store was dropped).
/// A thread of its own drains its queue without a hand-off per call.
#[derive(Clone)]
pub(super) struct ConnectionThread {
    jobs: Arc<std::sync::mpsc::Sender<Job>>,
}

impl ConnectionThread {
    /// Starts the thread. `keep` is dropped on the thread after its connection has
    /// closed (see `SqliteStore::open` for why the order matters).
    pub(super) fn start(
        name: &str,
        mut conn: Connection,
        keep: Option<ConnectionThread>,
    ) -> Result<ConnectionThread, StoreError> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for job in queue {
                    job(&mut conn);
                }
                drop(conn);
                drop(keep);
            })
            .map_err(|e| StoreError::Database(format!("starting the thread {name}: {e}")))?;
        Ok(ConnectionThread {
            jobs: Arc::new(jobs),
        })
    }

    /// Runs `f` on the thread and waits for its result without holding a runtime
    /// thread.
    pub(super) async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection) -> Result<R, Error> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn| {
            // A panic in `f` is reported like a failed storage task; the thread and
            // its connection carry on (an open transaction rolls back when dropped).
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn)))
                .unwrap_or_else(|_| {
                    Err(StoreError::Database("storage task panicked".into()).into())
                });
            let _ = reply.send(result.map_err(StoreError::from));
        });
        let stopped = || StoreError::Database("the storage thread has stopped".into());
        self.jobs.send(job).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// A passive checkpoint every [`CHECKPOINT_EVERY`] on this connection, while the
    /// store lives: it never waits for readers or writers, and no request pays for it.
    /// The last connection to close checkpoints what is left.
    pub(super) fn spawn_checkpoints(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let jobs = Arc::downgrade(&self.jobs);
        runtime.spawn(async move {
            let mut every = tokio::time::interval(CHECKPOINT_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every.tick().await;
            loop {
                every.tick().await;
                let Some(jobs) = jobs.upgrade() else {
                    return;
                };
                let result = ConnectionThread { jobs }
                    .run(|c| {
                        c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
                        Ok(())
                    })
                    .await;
                if let Err(e) = result {
                    tracing::debug!("WAL checkpoint: {e}");
                }
            }
        });
    }
}
