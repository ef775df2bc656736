//! Settings on PostgreSQL: every write bumps `settings_epoch` in the same transaction
//! and notifies the listeners of every replica.

use std::collections::BTreeMap;

use deadpool_postgres::Transaction;
use tokio::sync::watch;

use super::{PostgresStore, SETTINGS_CHANNEL};
use crate::{SettingsChange, StoreError, now_ms};

impl PostgresStore {
    /// Notifications of settings writes by any replica.
    pub fn settings_changes(&self) -> watch::Receiver<SettingsChange> {
        self.listener.changes.clone()
    }

    pub async fn settings_all(&self) -> Result<BTreeMap<String, String>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT key, value FROM settings")
            .await
            .map_err(|e| self.error(e))?;
        let rows = client.query(&stmt, &[]).await.map_err(|e| self.error(e))?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    pub async fn setting_set(&self, key: &str, value: &str) -> Result<(), StoreError> {
        if value.contains('\0') {
            return Err(StoreError::Invalid(format!(
                "the value of `{key}` contains a NUL character, which PostgreSQL cannot store"
            )));
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        tx.execute(
            "INSERT INTO settings(key, value, updated_ms) VALUES ($1, $2, $3)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_ms = excluded.updated_ms",
            &[&key, &value, &now_ms()],
        )
        .await
        .map_err(|e| self.error(e))?;
        bump_settings_epoch(&tx).await.map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))
    }

    pub async fn setting_unset(&self, key: &str) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let n_deleted = tx
            .execute("DELETE FROM settings WHERE key = $1", &[&key])
            .await
            .map_err(|e| self.error(e))?;
        if n_deleted > 0 {
            bump_settings_epoch(&tx).await.map_err(|e| self.error(e))?;
        }
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(n_deleted > 0)
    }

    /// The settings epoch: changes with every settings write by any replica.
    pub async fn settings_version(&self) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT epoch FROM settings_epoch WHERE id = 1")
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_opt(&stmt, &[])
            .await
            .map_err(|e| self.error(e))?;
        match row {
            Some(row) => row.try_get(0).map_err(|e| self.error(e)),
            None => Ok(0),
        }
    }
}

/// Bumps the epoch and notifies listeners; both take effect at commit.
async fn bump_settings_epoch(tx: &Transaction<'_>) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        "WITH e AS (UPDATE settings_epoch SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch)
         SELECT pg_notify($1, epoch::text) FROM e",
        &[&SETTINGS_CHANNEL],
    )
    .await
    .map(drop)
}
