//! The writers of the two logs. Routing decisions (`tool_history`) are queued without
//! waiting and written to the store in batches by one background task, so that a
//! request never waits for them. Tool calls (`audit_log`) are written before the
//! call's answer goes out, so that an acknowledged call is never missing.
//!
//! A full queue or a database error never blocks or fails a routing request: the
//! row is counted as dropped and a warning is logged. [`DecisionWriter::shutdown`]
//! writes every row still queued before it returns, so a graceful exit loses none;
//! a crash (`kill -9`) loses the rows still queued in the process: those of the last
//! [`LINGER`] window, at most [`QUEUE_CAPACITY`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadout::ToolError;
use loadout::settings::mask_json_secrets;
use loadout_store::{AuditRow, DecisionRow, Store};
use serde_json::{Value, json};
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
/// Handle to the decision writer's task; cheap to clone, clones share the queue.
#[derive(Clone)]
pub struct DecisionWriter {
    queue: mpsc::Sender<DecisionRow>,
    n_dropped: Arc<AtomicU64>,
    task: Arc<Mutex<Option<WriterTask>>>,
}

struct WriterTask {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<()>,
}

const LOG: &str = "decision log";

impl std::fmt::Debug for DecisionWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionWriter")
            .field("queued", &(QUEUE_CAPACITY - self.queue.capacity()))
            .field("dropped", &self.n_dropped())
            .finish()
    }
}

impl DecisionWriter {
    /// Starts the writer task on the current tokio runtime.
    pub fn start(store: Store) -> DecisionWriter {
        let (queue, rows) = mpsc::channel(QUEUE_CAPACITY);
        let (stop, stopped) = oneshot::channel();
        let n_dropped = Arc::new(AtomicU64::new(0));
        let handle = tokio::spawn(write_rows(store, rows, stopped, n_dropped.clone()));
        DecisionWriter {
            queue,
            n_dropped,
            task: Arc::new(Mutex::new(Some(WriterTask { stop, handle }))),
        }
    }

    /// Queues a row; never waits. A full queue or a stopped writer drops the row.
    pub fn record(&self, row: DecisionRow) {
        if let Err(e) = self.queue.try_send(row) {
            let n = self.n_dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // One warning per power of two keeps a flood from flooding the log too.
            if n.is_power_of_two() {
                let why = match e {
                    mpsc::error::TrySendError::Full(_) => "queue full",
                    mpsc::error::TrySendError::Closed(_) => "writer stopped",
                };
                tracing::warn!("{LOG}: row dropped ({why}); {n} dropped so far");
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
            tracing::warn!("{LOG}: writer task failed: {e}");
        }
    }
}

async fn write_rows(
    store: Store,
    mut rows: mpsc::Receiver<DecisionRow>,
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
                insert(&store, &mut batch, &n_dropped).await;
                last_write = Some(Instant::now());
            }
        }
    }
    // No new rows from now on; what is already queued is still written.
    rows.close();
    while rows.recv_many(&mut batch, MAX_BATCH).await > 0 {
        insert(&store, &mut batch, &n_dropped).await;
    }
}

async fn insert(store: &Store, batch: &mut Vec<DecisionRow>, n_dropped: &AtomicU64) {
    let rows = std::mem::replace(batch, Vec::with_capacity(MAX_BATCH));
    let n = rows.len();
    if let Err(e) = store.decisions_insert(rows).await {
        n_dropped.fetch_add(n as u64, Ordering::Relaxed);
        tracing::warn!("{LOG}: {n} rows lost: {e}");
    }
}

/// Longest argument JSON kept whole in the audit log; longer ones are cut.
pub const MAX_AUDIT_ARGS_BYTES: usize = 8 * 1024;

/// Arguments as the audit log keeps them: secret values masked (setting names stay
/// readable), size bounded.
pub fn audit_args(args: &Value) -> Value {
    let masked = mask_json_secrets(args);
    let text = masked.to_string();
    if text.len() <= MAX_AUDIT_ARGS_BYTES {
        return masked;
    }
    let mut cut = MAX_AUDIT_ARGS_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    json!({"truncated": true, "bytes": text.len(), "prefix": &text[..cut]})
}

/// The `kind` tag of a tool error (`invalid_args`, `not_configured`, ...), the
/// audit row's outcome.
pub fn error_kind(error: &ToolError) -> String {
    serde_json::to_value(error)
        .ok()
        .and_then(|v| v.get("kind").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "error".into())
}

/// Epoch milliseconds as ISO 8601 UTC with milliseconds (`2026-11-26T23:41:07.123Z`);
/// the raw number when it is out of chrono's range.
pub fn iso_utc(at_ms: i64) -> String {
    match chrono::DateTime::from_timestamp_millis(at_ms) {
        Some(at) => at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        None => at_ms.to_string(),
    }
}

/// An audit row as `loadout audit --json` and `GET /api/audit` show it: the time
/// as ISO 8601 UTC (`at`) instead of the stored epoch milliseconds.
pub fn audit_json(row: &AuditRow) -> Value {
    json!({
        "at": iso_utc(row.at_ms),
        "client": row.client,
        "tool": row.tool,
        "args": row.args,
        "outcome": row.outcome,
        "detail": row.detail,
        "duration_ms": row.duration_ms,
    })
}

/// Writes each tool call's audit row before the call's answer goes out.
#[derive(Clone, Debug)]
pub struct AuditWriter {
    store: Store,
}

impl AuditWriter {
    pub fn new(store: Store) -> AuditWriter {
        AuditWriter { store }
    }

    /// Writes the row; a failure is logged, never returned: the call itself has
    /// happened, and its answer goes out either way.
    pub async fn record(&self, row: AuditRow) {
        self.record_for(None, row).await;
    }

    /// [`AuditWriter::record`] of a call made with a client's token: `/metrics`
    /// counts it under the client's name (the audit row names it already).
    pub async fn record_for(&self, client: Option<&crate::clients::Client>, row: AuditRow) {
        crate::metrics::record_tool_call(
            &row.tool,
            &row.outcome,
            client.map(|c| c.0.name.as_str()),
        );
        if let Err(e) = self.store.audit_insert(vec![row]).await {
            tracing::warn!("audit log: a row was not written: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use loadout_store::Reasons;

    use super::*;

    fn row(i: usize) -> DecisionRow {
        DecisionRow {
            at_ms: i as i64,
            session: None,
            turn: 1,
            message: format!("message {i}"),
            n_tools: 1,
            tokens: 1,
            reasons: Reasons::default(),
        }
    }

    #[test]
    fn audit_times_are_iso_8601_utc() {
        assert_eq!(iso_utc(1_795_736_467_123), "2026-11-26T23:41:07.123Z");
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_utc(i64::MAX), i64::MAX.to_string());
    }

    #[test]
    fn audit_args_mask_secret_values_keep_names_and_stay_small() {
        let masked = audit_args(&json!({"key": "llm_api_key", "value": "sk-123456789abcdef"}));
        assert_eq!(
            masked,
            json!({"key": "llm_api_key", "value": "********cdef"})
        );
        let big = audit_args(&json!({"content": "x".repeat(100_000)}));
        assert_eq!(big["truncated"], true);
        assert!(big.to_string().len() < 2 * MAX_AUDIT_ARGS_BYTES);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_writes_every_queued_row() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path()).await.expect("store");
        let writer = DecisionWriter::start(store.clone());
        let n = 1000;
        for i in 0..n {
            writer.record(row(i));
        }
        writer.shutdown().await;
        assert_eq!(writer.n_dropped(), 0);
        let rows = store.decisions_tail(2 * n).await.expect("tail");
        assert_eq!(rows.len(), n);
        assert_eq!(rows.last().map(|r| r.message.as_str()), Some("message 999"));
        // After shutdown, rows are refused without blocking, and counted.
        writer.record(row(n));
        assert_eq!(writer.n_dropped(), 1);
        writer.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_drops_instead_of_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path()).await.expect("store");
        let writer = DecisionWriter::start(store.clone());
        let started = std::time::Instant::now();
        for i in 0..(QUEUE_CAPACITY * 4) {
            writer.record(row(i));
        }
        assert!(started.elapsed() < Duration::from_secs(2));
        writer.shutdown().await;
        let written = store
            .decisions_tail(QUEUE_CAPACITY * 8)
            .await
            .expect("tail")
            .len() as u64;
        assert_eq!(written + writer.n_dropped(), (QUEUE_CAPACITY * 4) as u64);
    }
}
