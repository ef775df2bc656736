//! Clients on SQLite (see `crate::clients`).

use rusqlite::{OptionalExtension as _, params};

use super::SqliteStore;
use crate::StoreError;
use crate::clients::{ClientRow, list_from_text, list_to_text};

const COLUMNS: &str = "name, token_sha256, domains, tools, rate_per_min, read_only, created_ms";

fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<ClientRow> {
    let domains: String = r.get(2)?;
    let tools: String = r.get(3)?;
    let rate: Option<i64> = r.get(4)?;
    Ok(ClientRow {
        name: r.get(0)?,
        token_sha256: r.get(1)?,
        domains: list_from_text(&domains),
        tools: list_from_text(&tools),
        rate_per_min: rate.and_then(|n| u32::try_from(n).ok()),
        read_only: r.get(5)?,
        created_ms: r.get(6)?,
    })
}

impl SqliteStore {
    pub async fn client_insert(&self, row: ClientRow) -> Result<bool, StoreError> {
        self.call(move |c| {
            let n = c.execute(
                "INSERT INTO clients(name, token_sha256, domains, tools, rate_per_min, read_only, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT(name) DO NOTHING",
                params![
                    row.name,
                    row.token_sha256,
                    list_to_text(&row.domains),
                    list_to_text(&row.tools),
                    row.rate_per_min.map(i64::from),
                    row.read_only,
                    row.created_ms
                ],
            )?;
            Ok(n == 1)
        })
        .await
    }

    pub async fn clients_list(&self) -> Result<Vec<ClientRow>, StoreError> {
        self.call(|c| {
            let mut stmt =
                c.prepare_cached(&format!("SELECT {COLUMNS} FROM clients ORDER BY name"))?;
            let rows = stmt
                .query_map([], row_of)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    pub async fn client_revoke(&self, name: &str) -> Result<bool, StoreError> {
        let name = name.to_owned();
        self.call(move |c| Ok(c.execute("DELETE FROM clients WHERE name = ?1", [name])? == 1))
            .await
    }

    pub async fn client_by_token_hash(&self, hash: &str) -> Result<Option<ClientRow>, StoreError> {
        let hash = hash.to_owned();
        self.call(move |c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM clients WHERE token_sha256 = ?1"
            ))?;
            Ok(stmt.query_row([hash], row_of).optional()?)
        })
        .await
    }
}
