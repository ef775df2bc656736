//! The scratchpad on PostgreSQL: one schema per session namespace
//! (`scratchpad_<namespace>`), in the shared database.
//!
//! - Names: PostgreSQL folds unquoted names to lowercase, so table and column names
//!   are stored lowercase; `People`, `people` and `PEOPLE` name one table, as on
//!   SQLite, and the model's unquoted SQL finds them.
//! - Types: TEXT → `text`, INTEGER → `bigint` (a single INTEGER primary key is an
//!   identity column, numbered like SQLite's rowid), REAL → `double precision`,
//!   BOOLEAN → `boolean`, DATE → `date` (values must be text `YYYY-MM-DD`).
//! - `query_data` runs caller SQL as a NOLOGIN role of its own
//!   (`<user>_loadout_query`, created on first use) that owns nothing but the
//!   function the SQL runs in and holds no privilege of its own. Its transaction
//!   grants it USAGE on the namespace's schema and SELECT on that schema's tables,
//!   turns `READ ONLY`, sets `statement_timeout` and `search_path`, enters the role,
//!   parses the statement (extended protocol: one statement only) and runs it inside
//!   `loadout_scratchpad.run_query`, a SECURITY DEFINER function owned by the role,
//!   where PostgreSQL refuses any change of role. So the SQL can read the
//!   namespace's tables and nothing else: not loadout's own tables (settings, audit
//!   log, memories), not another namespace's schema. The transaction is always
//!   rolled back, which takes the grants with it, and the connection is closed
//!   afterwards, so no session state the query may have set survives. The database
//!   itself refuses writes and reads. Before any of that, statements that change the
//!   session or server (`SET`, `RESET`, `COPY`, …) and calls of functions that reach
//!   files, other databases or settings (`pg_read_file`, `dblink`, `set_config`, …)
//!   are refused by name ([`refused_statement`]), a second guard. Two queries
//!   of one namespace wait for each other (the grants lock the schema's catalog
//!   rows); queries of different namespaces do not.

mod cells;
mod query;
mod refused;
mod role;

use std::time::Duration;

use deadpool_postgres::Object;
use loadout::engine::scratchpad::{
    self as checks, ColumnInfo, ColumnType, CreateTableArgs, InsertDataArgs, QueryResult,
    RowsInserted, ScratchpadEngine, TableCreated, TableDescription, TableDropped, TableSummary,
    quoted,
};
use loadout::{BoxFuture, ToolError};
use serde_json::Value;
use tokio_postgres::Transaction;

use crate::{PostgresStore, StoreError};

pub use query::query_data;

/// A session's scratch schema in the shared database.
pub struct Scratchpad<'a> {
    pub store: &'a PostgresStore,
    pub namespace: &'a str,
}

impl ScratchpadEngine for Scratchpad<'_> {
    fn create_table(
        &self,
        args: CreateTableArgs,
    ) -> BoxFuture<'_, Result<TableCreated, ToolError>> {
        Box::pin(create_table(self.store, self.namespace, args))
    }

    fn insert_data(&self, args: InsertDataArgs) -> BoxFuture<'_, Result<RowsInserted, ToolError>> {
        Box::pin(insert_data(self.store, self.namespace, args))
    }

    fn query_data(
        &self,
        sql: String,
        limit: usize,
    ) -> BoxFuture<'_, Result<QueryResult, ToolError>> {
        Box::pin(query_data(
            self.store,
            self.namespace,
            sql,
            limit,
            QUERY_TIMEOUT,
        ))
    }

    fn list_tables(&self) -> BoxFuture<'_, Result<Vec<TableSummary>, ToolError>> {
        Box::pin(list_tables(self.store, self.namespace))
    }

    fn describe_table(&self, table: String) -> BoxFuture<'_, Result<TableDescription, ToolError>> {
        Box::pin(describe_table(self.store, self.namespace, table))
    }

    fn drop_table(&self, table: String) -> BoxFuture<'_, Result<TableDropped, ToolError>> {
        Box::pin(drop_table(self.store, self.namespace, table))
    }
}

/// How long one `query_data` statement may run.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema of a namespace. Short namespaces keep their name (case and `-` are
/// kept, the identifier is always quoted); long ones, which would pass PostgreSQL's
/// 63-byte limit, are cut and suffixed with a hash under another prefix, so that
/// two namespaces never share a schema.
pub fn schema_name(namespace: &str) -> String {
    const PREFIX: &str = "scratchpad_";
    if PREFIX.len() + namespace.len() <= 63 {
        format!("{PREFIX}{namespace}")
    } else {
        let head: String = namespace.chars().take(31).collect();
        format!("scratchpadh_{head}_{:016x}", fnv1a(namespace.as_bytes()))
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

pub async fn create_table(
    store: &PostgresStore,
    namespace: &str,
    mut args: CreateTableArgs,
) -> Result<TableCreated, ToolError> {
    checks::check_create_table(&args)?;
    // PostgreSQL folds unquoted names to lowercase: stored so, the model's unquoted
    // SQL finds them.
    for column in &mut args.columns {
        column.name = column.name.to_ascii_lowercase();
    }
    let table = args.table.to_ascii_lowercase();
    let sql = create_table_sql(&table, &args);
    let mut client = store.client().await?;
    let tx = begin(store, &mut client, namespace).await?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {}",
        quoted(&schema_name(namespace))
    ))
    .await
    .map_err(|e| pg_error(store, e))?;
    let existed = table_exists(&tx, &table)
        .await
        .map_err(|e| pg_error(store, e))?;
    if existed && !args.if_not_exists {
        return Err(checks::already_exists(&table));
    }
    if !existed {
        tx.batch_execute(&sql)
            .await
            .map_err(|e| pg_error(store, e))?;
        // Kept for describe_table, as SQLite keeps the statement in sqlite_schema.
        // Both texts are built from checked names and fixed type names only.
        tx.batch_execute(&format!(
            "COMMENT ON TABLE {} IS {}",
            quoted(&table),
            literal(&sql)
        ))
        .await
        .map_err(|e| pg_error(store, e))?;
    }
    tx.commit().await.map_err(|e| pg_error(store, e))?;
    Ok(TableCreated {
        table,
        sql,
        created: !existed,
    })
}

fn create_table_sql(table: &str, args: &CreateTableArgs) -> String {
    let n_keys = args.columns.iter().filter(|c| c.primary_key).count();
    let mut parts: Vec<String> = args
        .columns
        .iter()
        .map(|column| {
            let name = quoted(&column.name);
            let mut part = format!("{name} {}", pg_type(column.column_type));
            if column.primary_key && n_keys == 1 {
                if column.column_type == ColumnType::Integer {
                    part.push_str(" GENERATED BY DEFAULT AS IDENTITY");
                }
                part.push_str(" PRIMARY KEY");
            }
            if column.not_null {
                part.push_str(" NOT NULL");
            }
            part
        })
        .collect();
    if n_keys > 1 {
        let keys: Vec<String> = args
            .columns
            .iter()
            .filter(|c| c.primary_key)
            .map(|c| quoted(&c.name))
            .collect();
        parts.push(format!("PRIMARY KEY ({})", keys.join(", ")));
    }
    format!("CREATE TABLE {} ({})", quoted(table), parts.join(", "))
}

fn pg_type(column_type: ColumnType) -> &'static str {
    match column_type {
        ColumnType::Text => "text",
        ColumnType::Integer => "bigint",
        ColumnType::Real => "double precision",
        ColumnType::Boolean => "boolean",
        ColumnType::Date => "date",
    }
}

/// The scratchpad's name for a PostgreSQL column type.
fn type_label(pg: &str) -> String {
    match pg {
        "text" => "TEXT".into(),
        "bigint" => "INTEGER".into(),
        "double precision" => "REAL".into(),
        "boolean" => "BOOLEAN".into(),
        "date" => "DATE".into(),
        other => other.to_ascii_uppercase(),
    }
}

pub async fn insert_data(
    store: &PostgresStore,
    namespace: &str,
    args: InsertDataArgs,
) -> Result<RowsInserted, ToolError> {
    checks::check_identifier("table", &args.table)?;
    let table = args.table.to_ascii_lowercase();
    let mut client = store.client().await?;
    let tx = begin(store, &mut client, namespace).await?;
    let columns = columns(&tx, &table).await.map_err(|e| pg_error(store, e))?;
    if columns.is_empty() {
        return Err(no_such_table(&tx, &table).await);
    }
    for (row_idx, row) in args.rows.iter().enumerate() {
        let matched = checks::row_columns(row_idx, row, &table, &columns)?;
        let mut names = Vec::with_capacity(matched.len());
        let mut casts = Vec::with_capacity(matched.len());
        let mut values: Vec<Option<String>> = Vec::with_capacity(matched.len());
        for (idx, value) in matched {
            let column = &columns[idx];
            let text = json_to_text(value);
            if column.pg_type == "date"
                && let Some(text) = &text
                && !is_iso_date(text)
            {
                return Err(ToolError::execution(format!(
                    "row {row_idx}: CHECK constraint failed: column `{}` is DATE and takes text `YYYY-MM-DD`, not `{}`",
                    column.name,
                    text.chars().take(64).collect::<String>()
                )));
            }
            if column.pg_type == "boolean"
                && let Some(text) = &text
                && !matches!(text.as_str(), "0" | "1")
            {
                return Err(ToolError::execution(format!(
                    "row {row_idx}: CHECK constraint failed: column `{}` is BOOLEAN and takes true/false or 0/1, not `{}`",
                    column.name,
                    text.chars().take(64).collect::<String>()
                )));
            }
            names.push(quoted(&column.name));
            // Values travel as text and the server converts them to the column's
            // type (its own errors name the bad value); the type name comes from
            // the catalog, never from the caller.
            casts.push(format!(
                "CAST(${}::text AS {})",
                values.len() + 1,
                column.pg_type
            ));
            values.push(text);
        }
        let sql = format!(
            "INSERT INTO {} ({}) VALUES ({})",
            quoted(&table),
            names.join(", "),
            casts.join(", ")
        );
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values
            .iter()
            .map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        tx.execute(sql.as_str(), &params)
            .await
            .map_err(|e| match store.error(e) {
                StoreError::Database(message) => {
                    ToolError::execution(format!("row {row_idx}: {}", constraint_message(message)))
                }
                other => other.into(),
            })?;
    }
    let n_rows_total = count_rows(&tx, &table)
        .await
        .map_err(|e| pg_error(store, e))?;
    tx.commit().await.map_err(|e| pg_error(store, e))?;
    Ok(RowsInserted {
        table,
        n_inserted: args.rows.len(),
        n_rows_total,
    })
}

/// A JSON value as the text PostgreSQL parses into the column's type: booleans as
/// `1`/`0` as on SQLite (a BOOLEAN column reads them as true/false), arrays and
/// objects as JSON text.
fn json_to_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::Bool(b) => Some(if *b { "1" } else { "0" }.to_owned()),
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

fn is_iso_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 10
        && bytes.iter().enumerate().all(|(idx, b)| match idx {
            4 | 7 => *b == b'-',
            _ => b.is_ascii_digit(),
        })
}

pub async fn list_tables(
    store: &PostgresStore,
    namespace: &str,
) -> Result<Vec<TableSummary>, ToolError> {
    let mut client = store.client().await?;
    let tx = begin(store, &mut client, namespace).await?;
    let mut tables = Vec::new();
    for table in table_names(&tx).await.map_err(|e| pg_error(store, e))? {
        let columns = columns(&tx, &table).await.map_err(|e| pg_error(store, e))?;
        tables.push(TableSummary {
            n_rows: count_rows(&tx, &table)
                .await
                .map_err(|e| pg_error(store, e))?,
            columns: columns.into_iter().map(|c| c.name).collect(),
            table,
        });
    }
    tx.rollback().await.map_err(|e| pg_error(store, e))?;
    Ok(tables)
}

pub async fn describe_table(
    store: &PostgresStore,
    namespace: &str,
    table: String,
) -> Result<TableDescription, ToolError> {
    checks::check_identifier("table", &table)?;
    let table = table.to_ascii_lowercase();
    let mut client = store.client().await?;
    let tx = begin(store, &mut client, namespace).await?;
    let columns = columns(&tx, &table).await.map_err(|e| pg_error(store, e))?;
    if columns.is_empty() {
        return Err(no_such_table(&tx, &table).await);
    }
    let comment: Option<String> = tx
        .query_one(
            "SELECT obj_description(c.oid, 'pg_class') FROM pg_class c
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = $1",
            &[&table],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| pg_error(store, e))?;
    let n_rows = count_rows(&tx, &table)
        .await
        .map_err(|e| pg_error(store, e))?;
    tx.rollback().await.map_err(|e| pg_error(store, e))?;
    let sql = comment.unwrap_or_else(|| {
        let parts: Vec<String> = columns
            .iter()
            .map(|c| format!("{} {}", quoted(&c.name), c.pg_type))
            .collect();
        format!("CREATE TABLE {} ({})", quoted(&table), parts.join(", "))
    });
    Ok(TableDescription {
        table,
        columns: columns
            .into_iter()
            .map(|c| ColumnInfo {
                column_type: type_label(&c.pg_type),
                name: c.name,
                not_null: c.not_null,
                primary_key: c.primary_key,
                default: c.default,
            })
            .collect(),
        n_rows,
        sql,
    })
}

pub async fn drop_table(
    store: &PostgresStore,
    namespace: &str,
    table: String,
) -> Result<TableDropped, ToolError> {
    checks::check_identifier("table", &table)?;
    let table = table.to_ascii_lowercase();
    let mut client = store.client().await?;
    let tx = begin(store, &mut client, namespace).await?;
    if !table_exists(&tx, &table)
        .await
        .map_err(|e| pg_error(store, e))?
    {
        return Err(no_such_table(&tx, &table).await);
    }
    let n_rows_deleted = count_rows(&tx, &table)
        .await
        .map_err(|e| pg_error(store, e))?;
    tx.batch_execute(&format!("DROP TABLE {}", quoted(&table)))
        .await
        .map_err(|e| pg_error(store, e))?;
    tx.commit().await.map_err(|e| pg_error(store, e))?;
    Ok(TableDropped {
        table,
        n_rows_deleted,
    })
}

// ---------------------------------------------------------------------------
// Helpers

/// A statement error as a tool error with the server's message; an unreachable
/// database as a storage error.
fn pg_error(store: &PostgresStore, e: tokio_postgres::Error) -> ToolError {
    match store.error(e) {
        StoreError::Database(message) => ToolError::execution(constraint_message(message)),
        other => other.into(),
    }
}

/// Names constraint failures the way SQLite does, so that messages read the same on
/// both engines.
fn constraint_message(message: String) -> String {
    if message.contains("violates check constraint") {
        format!("CHECK constraint failed: {message}")
    } else if message.contains("violates not-null constraint") {
        format!("NOT NULL constraint failed: {message}")
    } else if message.contains("duplicate key value violates unique constraint") {
        format!("UNIQUE constraint failed: {message}")
    } else {
        message
    }
}

/// A transaction on `client` whose `search_path` is the namespace's schema: the setup
/// every engine call but `query_data` shares.
async fn begin<'c>(
    store: &PostgresStore,
    client: &'c mut Object,
    namespace: &str,
) -> Result<deadpool_postgres::Transaction<'c>, ToolError> {
    let tx = client.transaction().await.map_err(|e| pg_error(store, e))?;
    set_search_path(&tx, &schema_name(namespace))
        .await
        .map_err(|e| pg_error(store, e))?;
    Ok(tx)
}

/// `search_path` for the rest of the transaction: the namespace's schema only
/// (`pg_catalog` is always searched first).
async fn set_search_path(tx: &Transaction<'_>, schema: &str) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        "SELECT pg_catalog.set_config('search_path', $1, true)",
        &[&quoted(schema)],
    )
    .await
    .map(drop)
}

fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

struct Column {
    name: String,
    pg_type: String,
    not_null: bool,
    primary_key: bool,
    default: Option<String>,
}

impl AsRef<str> for Column {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

/// The table's columns in order; empty when the schema has no such table.
async fn columns(tx: &Transaction<'_>, table: &str) -> Result<Vec<Column>, tokio_postgres::Error> {
    let rows = tx
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                    COALESCE(a.attnum = ANY(i.indkey), false),
                    pg_get_expr(d.adbin, d.adrelid)
             FROM pg_class c
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
             LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
             LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = $1
               AND c.relkind = 'r'
             ORDER BY a.attnum",
            &[&table],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Column {
                name: r.try_get(0)?,
                pg_type: r.try_get(1)?,
                not_null: r.try_get(2)?,
                primary_key: r.try_get(3)?,
                default: r.try_get(4)?,
            })
        })
        .collect()
}

async fn table_names(tx: &Transaction<'_>) -> Result<Vec<String>, tokio_postgres::Error> {
    // current_schema() is NULL when the namespace's schema does not exist yet.
    let rows = tx
        .query(
            "SELECT c.relname::text FROM pg_class c
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'
             ORDER BY c.relname",
            &[],
        )
        .await?;
    rows.iter().map(|r| r.try_get(0)).collect()
}

async fn table_exists(tx: &Transaction<'_>, table: &str) -> Result<bool, tokio_postgres::Error> {
    Ok(tx
        .query_opt(
            "SELECT 1 FROM pg_class c
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = $1
               AND c.relkind = 'r'",
            &[&table],
        )
        .await?
        .is_some())
}

async fn no_such_table(tx: &Transaction<'_>, table: &str) -> ToolError {
    checks::no_such_table(table, &table_names(tx).await.unwrap_or_default())
}

async fn count_rows(tx: &Transaction<'_>, table: &str) -> Result<i64, tokio_postgres::Error> {
    tx.query_one(&format!("SELECT count(*) FROM {}", quoted(table)), &[])
        .await?
        .try_get(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_distinct_and_short() {
        assert_eq!(schema_name("alice"), "scratchpad_alice");
        assert_eq!(schema_name("Alice-1"), "scratchpad_Alice-1");
        let long = "a".repeat(64);
        let longer = "a".repeat(65);
        assert!(schema_name(&long).len() <= 63);
        assert_ne!(schema_name(&long), schema_name(&longer));
        assert!(schema_name(&long).starts_with("scratchpadh_"));
    }

    #[test]
    fn iso_dates_are_recognised() {
        assert!(is_iso_date("2001-12-31"));
        assert!(!is_iso_date("31/12/2001"));
        assert!(!is_iso_date("2001-1-31"));
    }
}
