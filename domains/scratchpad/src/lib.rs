//! The `scratchpad` domain: small SQL tables a model creates, fills and queries
//! during a session, one database per session namespace.
//!
//! Tools are engine-neutral: each asks [`engine`] for the [`ScratchpadEngine`] of
//! its session on the storage it runs on (`sqlite`: one database file per namespace;
//! `postgres`: one schema per namespace). `query_data` is read-only because the database engine
//! refuses writes (a read-only connection, a `READ ONLY` transaction), not because
//! the SQL text was inspected; what a statement may touch besides its tables
//! (pragmas, attached files, server functions) is refused as well. The engines live in
//! the store; the checks every engine makes before its SQL, in
//! [`loadout::engine::scratchpad`]. Depends on `loadout` only, never on a storage
//! driver or another domain crate.

pub use loadout::engine::scratchpad::{
    ColumnInfo, ColumnSpec, ColumnType, CreateTableArgs, InsertDataArgs, MAX_COLUMNS, QueryResult,
    RowsInserted, ScratchpadEngine, TableCreated, TableDescription, TableDropped, TableSummary,
    check_identifier,
};
use loadout::{ToolContext, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;

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

// ---------------------------------------------------------------------------
// Arguments (the rest are the engine's: `loadout::engine::scratchpad`)

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

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TableArgs {
    /// The table's name.
    pub table: String,
}

// ---------------------------------------------------------------------------
// Tools

/// The scratch database of `ctx`'s session, on the storage it runs on.
pub fn engine(ctx: &ToolContext) -> Result<Box<dyn ScratchpadEngine + '_>, ToolError> {
    let namespace = namespace(ctx)?;
    ctx.storage().scratchpad_engine(namespace).ok_or_else(|| {
        ToolError::execution("the scratchpad is not supported on this storage backend yet")
    })
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

#[cfg(test)]
mod tests;
