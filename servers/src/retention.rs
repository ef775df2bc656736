//! How long the decision log (`tool_history`) keeps its rows. Every routed message
//! adds a row of a few kilobytes, so a busy server's log would otherwise grow without
//! bound. The audit log is not pruned: it is the record of what tools did.

use std::collections::BTreeMap;
use std::time::Duration;

use loadout::{Settings, StoreError};
use loadout_store::Store;
use loadout_store::now_ms;

/// The setting: days a decision row is kept; `0` or `forever` keeps every row.
pub const DECISION_LOG_DAYS_SETTING: &str = "decision_log_days";
/// Kept when the setting is unset or not understood.
pub const DEFAULT_DECISION_LOG_DAYS: u32 = 90;
/// How often old rows are looked for; the first look is a minute after start.
const PRUNE_EVERY: Duration = Duration::from_secs(60 * 60);
const FIRST_PRUNE_AFTER: Duration = Duration::from_secs(60);
/// Rows deleted per statement; a pause between statements leaves the database to
/// requests and the log writer.
const PRUNE_BATCH: usize = 5_000;
const PAUSE_BETWEEN_BATCHES: Duration = Duration::from_millis(100);

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// Days to keep, or `None` to keep every row. A value that is not a whole number of
/// days keeps the default and warns: a typo never deletes more than the default would.
pub fn decision_log_days(settings: &BTreeMap<String, String>) -> Option<u32> {
    let value = settings
        .get(DECISION_LOG_DAYS_SETTING)
        .map_or("", |v| v.trim());
    match value.parse::<u32>() {
        // Any spelling of zero: `00` must not mean "keep nothing".
        Ok(0) => None,
        Ok(days) => Some(days),
        Err(_) if value == "forever" => None,
        Err(_) if value.is_empty() => Some(DEFAULT_DECISION_LOG_DAYS),
        Err(_) => {
            tracing::warn!(
                "setting {DECISION_LOG_DAYS_SETTING} = {value:?} is not a number of days: keeping {DEFAULT_DECISION_LOG_DAYS}"
            );
            Some(DEFAULT_DECISION_LOG_DAYS)
        }
    }
}

/// Deletes the decision rows the settings no longer keep, as of `now_ms`; returns how
/// many went.
pub async fn prune_decisions(
    store: &Store,
    settings: &BTreeMap<String, String>,
    now_ms: i64,
) -> Result<usize, StoreError> {
    let Some(days) = decision_log_days(settings) else {
        return Ok(0);
    };
    let before_ms = now_ms.saturating_sub(i64::from(days).saturating_mul(DAY_MS));
    let mut n_deleted = 0;
    loop {
        let n = store.decisions_prune(before_ms, PRUNE_BATCH).await?;
        n_deleted += n;
        if n < PRUNE_BATCH {
            return Ok(n_deleted);
        }
        tokio::time::sleep(PAUSE_BETWEEN_BATCHES).await;
    }
}

/// Prunes the decision log a minute after start and every hour after, while the
/// process runs. Every replica may do it: deleting rows already gone is a no-op.
pub fn spawn(store: Store, settings: Settings) {
    tokio::spawn(async move {
        tokio::time::sleep(FIRST_PRUNE_AFTER).await;
        let mut every = tokio::time::interval(PRUNE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let result = match settings.snapshot().await {
                Ok(snapshot) => prune_decisions(&store, &snapshot, now_ms()).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(0) => {}
                Ok(n) => tracing::info!("decision log: {n} rows past their retention deleted"),
                Err(e) => tracing::warn!("decision log retention: {e}"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadout_store::{DecisionRow, Reasons};

    fn row(at_ms: i64) -> DecisionRow {
        DecisionRow {
            at_ms,
            session: Some("s".into()),
            turn: 1,
            message: "m".into(),
            n_tools: 1,
            tokens: 1,
            reasons: Reasons::default(),
        }
    }

    fn days(value: Option<&str>) -> BTreeMap<String, String> {
        value
            .map(|v| BTreeMap::from([(DECISION_LOG_DAYS_SETTING.to_owned(), v.to_owned())]))
            .unwrap_or_default()
    }

    async fn kept_after(setting: Option<&str>, ages_in_days: &[i64]) -> Vec<i64> {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path()).await.expect("store");
        let now = 1_000 * DAY_MS;
        let rows: Vec<DecisionRow> = ages_in_days
            .iter()
            .map(|age| row(now - age * DAY_MS - 1))
            .collect();
        store.decisions_insert(rows.clone()).await.expect("insert");
        prune_decisions(&store, &days(setting), now)
            .await
            .expect("prune");
        store
            .decisions("s")
            .await
            .expect("decisions")
            .iter()
            .map(|r| (now - r.at_ms) / DAY_MS)
            .collect()
    }

    #[tokio::test]
    async fn rows_older_than_the_setting_go_and_the_rest_stay() {
        assert_eq!(kept_after(Some("7"), &[400, 30, 8, 6, 0]).await, [6, 0]);
        assert_eq!(kept_after(None, &[400, 100, 89, 0]).await, [89, 0]);
        assert_eq!(kept_after(Some(""), &[400, 89]).await, [89]);
        assert_eq!(kept_after(Some("0"), &[400, 0]).await, [400, 0]);
        assert_eq!(kept_after(Some("00"), &[400, 0]).await, [400, 0]);
        assert_eq!(kept_after(Some("forever"), &[400, 0]).await, [400, 0]);
        // Not understood: the default, never more.
        assert_eq!(kept_after(Some("-3"), &[400, 89, 1]).await, [89, 1]);
        assert_eq!(kept_after(Some("a week"), &[400, 89, 1]).await, [89, 1]);
    }

    #[tokio::test]
    async fn more_old_rows_than_one_batch_all_go() {
        let n = PRUNE_BATCH + 10;
        let ages: Vec<i64> = std::iter::repeat_n(200, n).chain([1]).collect();
        assert_eq!(kept_after(Some("30"), &ages).await, [1]);
    }
}
