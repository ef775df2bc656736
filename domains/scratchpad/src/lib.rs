//! The `scratchpad` domain: small SQL tables a model creates, fills and queries
//! during a session, one database per session namespace.
//!
//! Tools are engine-neutral: each asks [`engine`] for the [`ScratchpadEngine`] of
//! its session on the storage it runs on (`sqlite`: one database file per namespace;
//! `postgres`: one schema per namespace). `query_data` is read-only because the database engine
//! refuses writes (a read-only connection, a `READ ONLY` transaction), not because
//! the SQL text was inspected; what a statement may touch besides its tables
//! (pragmas, attached files, server functions) is refused as well. Depends on `loadout` and `loadout-store`, never on
//! another domain crate.

mod postgres;
mod sqlite;

use loadout::{BoxFuture, ToolContext, ToolError};
use loadout_store::{Store, StoreBackend};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

loadout::domain! {
    name: "scratchpad",
    description: "A private SQL scratch database for this session: create tables, insert rows, and run read-only SELECT queries to sort, filter, join and aggregate data.",
    keywords: [
        "sql", "table", "database", "query", "select", "rows", "columns",
        "spreadsheet", "aggregate", "sqlite", "scratchpad", "테이블", "데이터베이스", "쿼리",
    ],
}

/// Referenced by the `loadout-domains` hub so the linker keeps this crate.
pub fn link() {}

/// Default and largest number of rows `query_data` returns.
pub const DEFAULT_ROW_LIMIT: usize = 100;
pub const MAX_ROW_LIMIT: usize = 1000;
/// Most rows one `insert_data` call takes.
pub const MAX_INSERT_ROWS: usize = 1000;
/// Most columns a table may have.
pub const MAX_COLUMNS: usize = 100;

// ---------------------------------------------------------------------------
// Arguments and results

/// Column types a scratchpad table may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum ColumnType {
    Text,
    Integer,
    Real,
    // Stored as 0 or 1; JSON `true`/`false` are accepted on insert. (No doc comments
    // on variants: they would turn the schema's plain `enum` into a `oneOf`.)
    Boolean,
    // Text `YYYY-MM-DD`.
    Date,
}

impl ColumnType {
    pub fn sql_name(self) -> &'static str {
        match self {
            ColumnType::Text => "TEXT",
            ColumnType::Integer => "INTEGER",
            ColumnType::Real => "REAL",
            ColumnType::Boolean => "BOOLEAN",
            ColumnType::Date => "DATE",
        }
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ColumnSpec {
    /// Column name: a letter or `_`, then letters, digits or `_` (at most 63).
    pub name: String,
    /// One of TEXT, INTEGER, REAL, BOOLEAN (0/1, true/false) or DATE (text `YYYY-MM-DD`).
    #[serde(rename = "type")]
    pub column_type: ColumnType,
    /// Refuse rows without a value for this column.
    #[serde(default)]
    pub not_null: bool,
    /// Part of the primary key (several columns make a composite key).
    #[serde(default)]
    pub primary_key: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTableArgs {
    /// Table name: a letter or `_`, then letters, digits or `_` (at most 63).
    pub table: String,
    /// The columns, in order.
    pub columns: Vec<ColumnSpec>,
    /// Succeed without change when the table already exists.
    #[serde(default)]
    pub if_not_exists: bool,
}

#[derive(Debug, Serialize)]
pub struct TableCreated {
    pub table: String,
    /// The statement that was run.
    pub sql: String,
    /// False when `if_not_exists` found the table already there.
    pub created: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InsertDataArgs {
    /// The table to insert into.
    pub table: String,
    /// Rows as JSON objects mapping column names to values, e.g.
    /// `[{"name": "Ana", "age": 31}]`. Missing columns get NULL (or their default);
    /// arrays and objects are stored as JSON text.
    pub rows: Vec<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Serialize)]
pub struct RowsInserted {
    pub table: String,
    pub n_inserted: usize,
    pub n_rows_total: i64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryDataArgs {
    /// One read-only SQL statement, normally a SELECT (SQLite dialect, or PostgreSQL's
    /// on a PostgreSQL store; standard SQL works on both), e.g.
    /// `SELECT city, avg(price) FROM sales GROUP BY city ORDER BY 2 DESC`.
    pub sql: String,
    /// Most rows to return: default 100, at most 1000.
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct QueryResult {
    pub columns: Vec<String>,
    /// Each row is an array in `columns` order.
    pub rows: Vec<Vec<serde_json::Value>>,
    pub n_rows: usize,
    /// More rows matched than `limit`; add a LIMIT/OFFSET or narrow the query.
    pub truncated: bool,
    pub limit: usize,
}

#[derive(Debug, Serialize)]
pub struct TableSummary {
    pub table: String,
    pub n_rows: i64,
    pub columns: Vec<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TableArgs {
    /// The table's name.
    pub table: String,
}

#[derive(Debug, Serialize)]
pub struct ColumnInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub column_type: String,
    pub not_null: bool,
    pub primary_key: bool,
    pub default: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct TableDescription {
    pub table: String,
    pub columns: Vec<ColumnInfo>,
    pub n_rows: i64,
    /// The CREATE TABLE statement.
    pub sql: String,
}

#[derive(Debug, Serialize)]
pub struct TableDropped {
    pub table: String,
    pub n_rows_deleted: i64,
}

// ---------------------------------------------------------------------------
// Tools

/// A session's scratch database on one storage backend.
pub trait ScratchpadEngine: Send + Sync {
    fn create_table(&self, args: CreateTableArgs)
    -> BoxFuture<'_, Result<TableCreated, ToolError>>;
    fn insert_data(&self, args: InsertDataArgs) -> BoxFuture<'_, Result<RowsInserted, ToolError>>;
    fn query_data(
        &self,
        sql: String,
        limit: usize,
    ) -> BoxFuture<'_, Result<QueryResult, ToolError>>;
    fn list_tables(&self) -> BoxFuture<'_, Result<Vec<TableSummary>, ToolError>>;
    fn describe_table(&self, table: String) -> BoxFuture<'_, Result<TableDescription, ToolError>>;
    fn drop_table(&self, table: String) -> BoxFuture<'_, Result<TableDropped, ToolError>>;
}

/// The scratch database of `ctx`'s session, on the storage it runs on.
pub fn engine(ctx: &ToolContext) -> Result<Box<dyn ScratchpadEngine + '_>, ToolError> {
    let namespace = namespace(ctx)?;
    match Store::of(ctx)?.backend() {
        StoreBackend::Sqlite(_) => Ok(Box::new(sqlite::Scratchpad {
            path: ctx
                .storage()
                .data_dir()
                .join("scratchpad")
                .join(format!("{namespace}.db")),
        })),
        StoreBackend::Postgres(store) => Ok(Box::new(postgres::Scratchpad { store, namespace })),
        _ => Err(ToolError::execution(
            "the scratchpad is not supported on this storage backend yet",
        )),
    }
}

/// Creates a table in this session's scratch database, with typed columns.
///
/// Column types: TEXT, INTEGER, REAL, BOOLEAN, DATE (`YYYY-MM-DD`). Then fill it with
/// `insert_data` and read it with `query_data`.
#[loadout::tool(
    domain = "scratchpad",
    keywords = ["create table", "new table", "schema", "columns", "테이블 생성"],
    pins_domain = true,
    read_only = false,
    destructive = false,
    idempotent = false,
    open_world = false
)]
pub async fn create_table(
    args: CreateTableArgs,
    ctx: &ToolContext,
) -> Result<TableCreated, ToolError> {
    engine(ctx)?.create_table(args).await
}

/// Inserts rows (JSON objects keyed by column name) into a scratchpad table, all or none.
///
/// Values are bound as parameters, never spliced into SQL. At most 1000 rows per call.
#[loadout::tool(
    domain = "scratchpad",
    keywords = ["insert", "add rows", "append", "store data", "행 추가"],
    read_only = false,
    destructive = false,
    idempotent = false,
    open_world = false
)]
pub async fn insert_data(
    args: InsertDataArgs,
    ctx: &ToolContext,
) -> Result<RowsInserted, ToolError> {
    if args.rows.is_empty() {
        return Err(ToolError::execution(
            "`rows` is empty: give at least one row",
        ));
    }
    if args.rows.len() > MAX_INSERT_ROWS {
        return Err(ToolError::execution(format!(
            "{} rows given; at most {MAX_INSERT_ROWS} per call",
            args.rows.len()
        )));
    }
    engine(ctx)?.insert_data(args).await
}

/// Runs one read-only SQL query (SELECT) on this session's scratch tables and returns the rows.
///
/// The database refuses any write, so use `insert_data`, `create_table` and
/// `drop_table` to change data. Returns at most `limit` rows (default 100, max 1000)
/// and says when more matched.
#[loadout::tool(
    domain = "scratchpad",
    keywords = ["select", "query", "sql", "filter", "sort", "group by", "join", "count", "조회"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn query_data(args: QueryDataArgs, ctx: &ToolContext) -> Result<QueryResult, ToolError> {
    let limit = match args.limit {
        None => DEFAULT_ROW_LIMIT,
        Some(0) => return Err(ToolError::execution("`limit` must be at least 1")),
        Some(n) => (n as usize).min(MAX_ROW_LIMIT),
    };
    engine(ctx)?.query_data(args.sql, limit).await
}

/// Lists the tables of this session's scratch database with their columns and row counts.
#[loadout::tool(
    domain = "scratchpad",
    keywords = ["tables", "list tables", "show tables", "테이블 목록"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn list_tables(ctx: &ToolContext) -> Result<Vec<TableSummary>, ToolError> {
    engine(ctx)?.list_tables().await
}

/// Describes one scratchpad table: columns with types and constraints, row count, and its CREATE statement.
#[loadout::tool(
    domain = "scratchpad",
    keywords = ["describe", "schema", "columns", "structure", "테이블 구조"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn describe_table(
    args: TableArgs,
    ctx: &ToolContext,
) -> Result<TableDescription, ToolError> {
    engine(ctx)?.describe_table(args.table).await
}

/// Deletes a scratchpad table and all its rows; this cannot be undone.
#[loadout::tool(
    domain = "scratchpad",
    keywords = ["drop table", "delete table", "remove table", "테이블 삭제"],
    read_only = false,
    destructive = true,
    idempotent = false,
    open_world = false
)]
pub async fn drop_table(args: TableArgs, ctx: &ToolContext) -> Result<TableDropped, ToolError> {
    engine(ctx)?.drop_table(args.table).await
}

// ---------------------------------------------------------------------------
// Shared checks

/// The session's namespace, checked: it names a file (SQLite) or a schema
/// (PostgreSQL).
fn namespace(ctx: &ToolContext) -> Result<&str, ToolError> {
    let namespace = ctx.namespace();
    let ok = !namespace.is_empty()
        && namespace.len() <= 128
        && namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        return Err(ToolError::execution(
            "this session's namespace cannot name a scratchpad database (expected letters, digits, `_` or `-`)",
        ));
    }
    Ok(namespace)
}

/// Checks a table or column name: `[A-Za-z_][A-Za-z0-9_]{0,62}`, not reserved by SQLite.
pub fn check_identifier(what: &str, name: &str) -> Result<(), ToolError> {
    let mut bytes = name.bytes();
    let ok = name.len() <= 63
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !ok {
        return Err(ToolError::execution(format!(
            "invalid {what} name `{}`: use a letter or `_` followed by up to 62 letters, digits or `_`",
            name.chars().take(64).collect::<String>()
        )));
    }
    if name.to_ascii_lowercase().starts_with("sqlite_") {
        return Err(ToolError::execution(format!(
            "invalid {what} name `{name}`: names starting with `sqlite_` are reserved"
        )));
    }
    Ok(())
}

/// Quotes a name that [`check_identifier`] accepted.
fn quoted(name: &str) -> String {
    format!("\"{name}\"")
}

#[cfg(test)]
mod tests;
