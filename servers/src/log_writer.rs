//! Background writers for the logs that must stay off the hot path: tool calls
//! (`audit_log`) and routing decisions (`tool_history`). Rows are queued without
//! waiting and written to the store in batches.
//!
//! A full queue or a database error never blocks or fails a call or a routing
//! request: the row is counted as dropped and a warning is logged.
//! [`LogWriter::shutdown`] writes every row still queued before it returns, so a
//! graceful exit loses none.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadout::Store;
use loadout::StoreError;
use loadout::store::{AuditRow, DecisionRow, LogPace};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Rows waiting to be written; beyond this, new rows are dropped (and counted).
pub const QUEUE_CAPACITY: usize = 8192;
/// Most rows written in one transaction.
pub const MAX_BATCH: usize = 1024;
/// While rows keep coming, a write waits until this long after the previous one, so
/// that a busy server writes few large transactions (each commit rewrites the pages
/// it touched, a cost per transaction, not per row). A row after a quiet spell is
/// written at once.
pub const LINGER: Duration = Duration::from_millis(50);
/// Rows still queued behind a batch from which the writer counts as behind: the
/// batch is written at normal priority ([`LogPace::CatchUp`]) instead of on idle CPU
/// time. A quarter of the queue leaves three quarters of headroom before rows drop.
pub const BEHIND_ROWS: usize = QUEUE_CAPACITY / 4;

/// Handle to the writer task; cheap to clone, clones share the queue.
#[derive(Clone)]
pub struct LogWriter<R: LogRow> {
    queue: mpsc::Sender<R>,
    n_dropped: Arc<AtomicU64>,
    task: Arc<Mutex<Option<WriterTask>>>,
}

struct WriterTask {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<()>,
}

impl<R: LogRow> std::fmt::Debug for LogWriter<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(R::LOG)
            .field("queued", &(QUEUE_CAPACITY - self.queue.capacity()))
            .field("dropped", &self.n_dropped())
            .finish()
    }
}

impl<R: LogRow> LogWriter<R> {
    /// Starts the writer task on the current tokio runtime.
    pub fn start(store: Store) -> LogWriter<R> {
        let (queue, rows) = mpsc::channel(QUEUE_CAPACITY);
        let (stop, stopped) = oneshot::channel();
        let n_dropped = Arc::new(AtomicU64::new(0));
        let handle = tokio::spawn(write_rows(store, rows, stopped, n_dropped.clone()));
        LogWriter {
            queue,
            n_dropped,
            task: Arc::new(Mutex::new(Some(WriterTask { stop, handle }))),
        }
    }

    /// Queues a row; never waits. A full queue or a stopped writer drops the row.
    pub fn record(&self, row: R) {
        if let Err(e) = self.queue.try_send(row) {
            let n = self.n_dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // One warning per power of two keeps a flood from flooding the log too.
            if n.is_power_of_two() {
                let why = match e {
                    mpsc::error::TrySendError::Full(_) => "queue full",
                    mpsc::error::TrySendError::Closed(_) => "writer stopped",
                };
                tracing::warn!("{}: row dropped ({why}); {n} dropped so far", R::LOG);
            }
        }
    }

    /// Rows lost so far (queue full, writer stopped, or a failed write).
    pub fn n_dropped(&self) -> u64 {
        self.n_dropped.load(Ordering::Relaxed)
    }

    /// Stops taking rows, writes every row already queued, and waits for the writer
    /// to finish. Later calls return at once.
    pub async fn shutdown(&self) {
        let task = self
            .task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        let Some(task) = task else { return };
        // The writer may already be gone (its runtime shut down); then there is
        // nothing left to flush.
        let _ = task.stop.send(());
        if let Err(e) = task.handle.await {
            tracing::warn!("{}: writer task failed: {e}", R::LOG);
        }
    }
}

async fn write_rows<R: LogRow>(
    store: Store,
    mut rows: mpsc::Receiver<R>,
    mut stopped: oneshot::Receiver<()>,
    n_dropped: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut last_write: Option<Instant> = None;
    let mut stopping = false;
    while !stopping {
        tokio::select! {
            biased;
            _ = &mut stopped => stopping = true,
            n = rows.recv_many(&mut batch, MAX_BATCH) => {
                if n == 0 {
                    return;
                }
                // A steady stream of rows: gather until LINGER after the last write,
                // so each transaction carries many rows instead of a few.
                if let Some(last) = last_write
                    && batch.len() < MAX_BATCH
                    && last.elapsed() < LINGER
                {
                    tokio::select! {
                        biased;
                        _ = &mut stopped => stopping = true,
                        _ = tokio::time::sleep_until((last + LINGER).into()) => {}
                    }
                    while batch.len() < MAX_BATCH
                        && let Ok(row) = rows.try_recv()
                    {
                        batch.push(row);
                    }
                }
                let pace = if rows.len() >= BEHIND_ROWS {
                    LogPace::CatchUp
                } else {
                    LogPace::Idle
                };
                insert(&store, &mut batch, pace, &n_dropped).await;
                last_write = Some(Instant::now());
            }
        }
    }
    // No new rows from now on; what is already queued is still written.
    rows.close();
    // Shutting down: nothing is served any more, and nobody should wait for idle time.
    while rows.recv_many(&mut batch, MAX_BATCH).await > 0 {
        insert(&store, &mut batch, LogPace::CatchUp, &n_dropped).await;
    }
}

async fn insert<R: LogRow>(
    store: &Store,
    batch: &mut Vec<R>,
    pace: LogPace,
    n_dropped: &AtomicU64,
) {
    // The store takes the batch and frees it where it writes it (on SQLite, its log
    // thread): a request's thread never copies or frees a thousand rows at once.
    let rows = std::mem::replace(batch, Vec::with_capacity(MAX_BATCH));
    let n = rows.len();
    if let Err(e) = R::insert(store, rows, pace).await {
        n_dropped.fetch_add(n as u64, Ordering::Relaxed);
        tracing::warn!("{}: {n} rows lost: {e}", R::LOG);
    }
}

/// A row kind the background writer can store in batches.
pub trait LogRow: Send + 'static {
    /// Names the log in messages.
    const LOG: &'static str;
    /// Writes the batch (the store retries a failed write once).
    fn insert(
        store: &Store,
        rows: Vec<Self>,
        pace: LogPace,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + '_
    where
        Self: Sized;
}

impl LogRow for AuditRow {
    const LOG: &'static str = "audit log";
    fn insert(
        store: &Store,
        rows: Vec<Self>,
        pace: LogPace,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + '_ {
        store.audit_insert(rows, pace)
    }
}

impl LogRow for DecisionRow {
    const LOG: &'static str = "decision log";
    fn insert(
        store: &Store,
        rows: Vec<Self>,
        pace: LogPace,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + '_ {
        store.decisions_insert(rows, pace)
    }
}

/// Tool calls, for `loadout audit`.
pub type AuditWriter = LogWriter<AuditRow>;
/// Routing decisions (`tool_history`), kept off the routing hot path.
pub type DecisionWriter = LogWriter<DecisionRow>;

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: usize) -> AuditRow {
        AuditRow {
            at_ms: i as i64,
            client: "test".into(),
            tool: format!("tool_{i}"),
            args: serde_json::json!({"i": i}),
            outcome: "ok".into(),
            detail: None,
            duration_ms: 0.5,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_writes_every_queued_row() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path()).await.expect("store");
        let writer = AuditWriter::start(store.clone());
        let n = 1000;
        for i in 0..n {
            writer.record(row(i));
        }
        writer.shutdown().await;
        assert_eq!(writer.n_dropped(), 0);
        let rows = store.audit_tail(2 * n).await.expect("tail");
        assert_eq!(rows.len(), n);
        assert_eq!(rows.last().map(|r| r.tool.as_str()), Some("tool_999"));
        // After shutdown, rows are refused without blocking, and counted.
        writer.record(row(n));
        assert_eq!(writer.n_dropped(), 1);
        writer.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_drops_instead_of_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path()).await.expect("store");
        let writer = AuditWriter::start(store.clone());
        let started = std::time::Instant::now();
        for i in 0..(QUEUE_CAPACITY * 4) {
            writer.record(row(i));
        }
        assert!(started.elapsed() < Duration::from_secs(2));
        writer.shutdown().await;
        let written = store
            .audit_tail(QUEUE_CAPACITY * 8)
            .await
            .expect("tail")
            .len() as u64;
        assert_eq!(written + writer.n_dropped(), (QUEUE_CAPACITY * 4) as u64);
    }
}
