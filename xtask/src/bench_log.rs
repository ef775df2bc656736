//! The decision log's writes on SQLite, as the background writer makes them: batches
//! of 350 rows (a server logging 7,000 requests/s, one batch per 50 ms), rows from
//! one-off requests (no session) as the baseline in the same run, then rows spread
//! over 64 and over 1,000 sessions, and one-off rows with empty reasons: what
//! a row costs besides its reasons' bytes. Reports the time per row and the bytes the
//! process wrote per row (`wchar` of `/proc/self/io`: WAL frames and checkpoints).
//! A session's rows must cost about what one-off rows cost: what is written per
//! batch must not grow with the number of sessions a batch touches.

use std::time::Instant;

use anyhow::Context;
use loadout_store::Store;
use loadout_store::{DecisionRow, Reasons};

const BATCH: usize = 350;
/// Rows already in the log when the measured batches start.
const PREFILL_ROWS: usize = 200_000;

pub fn run(rows: &[DecisionRow], batches: usize) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    println!(
        "\n# decision log on SQLite: {batches} batches of {BATCH} rows each, rows of the shared catalog's selections, after {PREFILL_ROWS} rows"
    );
    let n_rows = rows.len().max(1);
    println!(
        "rows average {} bytes of reasons, {} of message",
        rows.iter()
            .map(|r| r.reasons.to_json().len())
            .sum::<usize>()
            / n_rows,
        rows.iter().map(|r| r.message.len()).sum::<usize>() / n_rows,
    );
    println!(
        "{:<22} {:>12} {:>15} {:>14}",
        "rows", "us per row", "bytes per row", "vs one-off"
    );
    let mut baseline: Option<(f64, f64)> = None;
    for (label, sessions, empty) in [
        ("one-off", 0usize, false),
        ("one-off, reasons `{}`", 0usize, true),
        ("64 sessions", 64, false),
        ("1,000 sessions", 1000, false),
    ] {
        let (us, bytes) = runtime.block_on(write_log(rows, batches, sessions, empty))?;
        let ratio = match baseline {
            None => {
                baseline = Some((us, bytes));
                "1.0x / 1.0x".to_owned()
            }
            Some((base_us, base_bytes)) => format!(
                "{:.1}x / {}",
                us / base_us,
                if base_bytes > 0.0 {
                    format!("{:.1}x", bytes / base_bytes)
                } else {
                    "-".into()
                }
            ),
        };
        let bytes = if bytes > 0.0 {
            format!("{bytes:.0}")
        } else {
            "-".into()
        };
        println!("{label:<22} {us:>12.2} {bytes:>15} {ratio:>14}");
    }
    Ok(())
}

/// Writes `batches` batches into a new store and returns µs and bytes written per
/// row, after [`PREFILL_ROWS`] rows with empty reasons: a log that has run a while,
/// whose pages exist (and, had it one, a session index of realistic size, where each
/// session's newest entries sit on a page of their own).
async fn write_log(
    rows: &[DecisionRow],
    batches: usize,
    sessions: usize,
    empty: bool,
) -> anyhow::Result<(f64, f64)> {
    let dir = std::env::temp_dir().join(format!(
        "loadout-bench-log-{}-{sessions}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open_dir(&dir).await?;
    let session_ids: Vec<String> = (0..sessions)
        .map(|i| format!("bench-session-{i:05}"))
        .collect();
    let mut next = 0usize;
    let mut batch = |small: bool| -> Vec<DecisionRow> {
        (0..BATCH)
            .map(|_| {
                let mut row = rows[next % rows.len()].clone();
                if small {
                    row.reasons = Reasons::default();
                }
                row.session = (!session_ids.is_empty())
                    .then(|| session_ids[(next * 7919) % session_ids.len()].clone());
                next += 1;
                row
            })
            .collect()
    };
    for _ in 0..PREFILL_ROWS / BATCH {
        store.decisions_insert(batch(true)).await?;
    }
    let written_before = written_bytes();
    let mut elapsed = std::time::Duration::ZERO;
    for _ in 0..batches {
        let rows = batch(empty);
        let started = Instant::now();
        store
            .decisions_insert(rows)
            .await
            .context("writing a batch")?;
        elapsed += started.elapsed();
    }
    let n = (batches * BATCH) as f64;
    let bytes = match (written_before, written_bytes()) {
        (Some(before), Some(after)) => after.saturating_sub(before) as f64 / n,
        _ => 0.0,
    };
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok((elapsed.as_secs_f64() * 1e6 / n, bytes))
}

/// Bytes this process has written with `write` and friends so far (Linux).
fn written_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|line| line.strip_prefix("wchar:"))
        .and_then(|n| n.trim().parse().ok())
}
