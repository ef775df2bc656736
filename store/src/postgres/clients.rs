//! Clients on PostgreSQL (see `crate::clients`).

use super::{PostgresStore, without_nul};
use crate::StoreError;
use crate::clients::{ClientRow, list_from_text, list_to_text};

fn row_of(r: &tokio_postgres::Row) -> Result<ClientRow, tokio_postgres::Error> {
    let domains: String = r.try_get(2)?;
    let tools: String = r.try_get(3)?;
    let rate: Option<i64> = r.try_get(4)?;
    Ok(ClientRow {
        name: r.try_get(0)?,
        token_sha256: r.try_get(1)?,
        domains: list_from_text(&domains),
        tools: list_from_text(&tools),
        rate_per_min: rate.and_then(|n| u32::try_from(n).ok()),
        read_only: r.try_get(5)?,
        created_ms: r.try_get(6)?,
    })
}

fn rows_of(
    rows: Vec<tokio_postgres::Row>,
    store: &PostgresStore,
) -> Result<Vec<ClientRow>, StoreError> {
    rows.iter()
        .map(row_of)
        .collect::<Result<_, _>>()
        .map_err(|e| store.error(e))
}

impl PostgresStore {
    pub async fn client_insert(&self, row: ClientRow) -> Result<bool, StoreError> {
        let n = self
            .execute(
                "INSERT INTO clients(name, token_sha256, domains, tools, rate_per_min, read_only, created_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO NOTHING",
                &[
                    &without_nul(&row.name),
                    &row.token_sha256,
                    &list_to_text(&row.domains),
                    &list_to_text(&row.tools),
                    &row.rate_per_min.map(i64::from),
                    &row.read_only,
                    &row.created_ms,
                ],
            )
            .await?;
        Ok(n == 1)
    }

    pub async fn clients_list(&self) -> Result<Vec<ClientRow>, StoreError> {
        let rows = self
            .query(
                "SELECT name, token_sha256, domains, tools, rate_per_min, read_only, created_ms
                 FROM clients ORDER BY name",
                &[],
            )
            .await?;
        rows_of(rows, self)
    }

    pub async fn client_revoke(&self, name: &str) -> Result<bool, StoreError> {
        let n = self
            .execute("DELETE FROM clients WHERE name = $1", &[&without_nul(name)])
            .await?;
        Ok(n == 1)
    }

    pub async fn client_by_token_hash(&self, hash: &str) -> Result<Option<ClientRow>, StoreError> {
        let rows = self
            .query(
                "SELECT name, token_sha256, domains, tools, rate_per_min, read_only, created_ms
                 FROM clients WHERE token_sha256 = $1",
                &[&hash],
            )
            .await?;
        Ok(rows_of(rows, self)?.into_iter().next())
    }
}
