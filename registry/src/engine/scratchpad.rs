//! The `scratchpad` domain's engine: small SQL tables a model creates, fills and
//! queries during a session, and the checks every backend applies before any of its
//! SQL runs (names, columns, rows), written once here.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{BoxFuture, ToolError};

/// Most columns a table may have.
pub const MAX_COLUMNS: usize = 100;
/// Longest text returned in one cell of a query result, in characters.
pub const MAX_CELL_CHARS: usize = 10_000;

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

// ---------------------------------------------------------------------------
// Checks every backend makes

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
pub fn quoted(name: &str) -> String {
    format!("\"{name}\"")
}

/// Checks a table definition: its name, one to [`MAX_COLUMNS`] columns with valid
/// names, none listed twice (names compare without case, as both engines do).
pub fn check_create_table(args: &CreateTableArgs) -> Result<(), ToolError> {
    check_identifier("table", &args.table)?;
    if args.columns.is_empty() {
        return Err(ToolError::execution("a table needs at least one column"));
    }
    if args.columns.len() > MAX_COLUMNS {
        return Err(ToolError::execution(format!(
            "{} columns given; at most {MAX_COLUMNS}",
            args.columns.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for column in &args.columns {
        check_identifier("column", &column.name)?;
        if !seen.insert(column.name.to_ascii_lowercase()) {
            return Err(ToolError::execution(format!(
                "column `{}` is listed twice",
                column.name
            )));
        }
    }
    Ok(())
}

/// One row of `insert_data` matched to the table's columns: for each key, the index
/// of the column it names (case-insensitively, as SQLite matches names) and its value.
/// Only names the table really has reach SQL; nothing the caller wrote does.
pub fn row_columns<'a, C: AsRef<str>>(
    row_idx: usize,
    row: &'a serde_json::Map<String, Value>,
    table: &str,
    columns: &[C],
) -> Result<Vec<(usize, &'a Value)>, ToolError> {
    if row.is_empty() {
        return Err(ToolError::execution(format!(
            "row {row_idx} is an empty object; give at least one column"
        )));
    }
    row.iter()
        .map(|(key, value)| {
            match columns
                .iter()
                .position(|c| c.as_ref().eq_ignore_ascii_case(key))
            {
                Some(idx) => Ok((idx, value)),
                None => Err(ToolError::execution(format!(
                    "row {row_idx}: table `{table}` has no column `{}`; columns: {}",
                    key.chars().take(64).collect::<String>(),
                    columns
                        .iter()
                        .map(AsRef::as_ref)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
            }
        })
        .collect()
}

/// Refuses an empty `query_data` statement before a connection is opened.
pub fn check_query(sql: &str) -> Result<(), ToolError> {
    if sql.trim().is_empty() {
        return Err(ToolError::execution("the query is empty"));
    }
    Ok(())
}

/// A table that `create_table` would create again.
pub fn already_exists(table: &str) -> ToolError {
    ToolError::execution(format!(
        "table `{table}` already exists; use describe_table to see it, drop_table to replace it, or pass if_not_exists"
    ))
}

/// A table that is not there, with the ones that are.
pub fn no_such_table(table: &str, existing: &[String]) -> ToolError {
    if existing.is_empty() {
        ToolError::execution(format!(
            "no table `{table}`: the scratchpad has no tables yet; create one with create_table"
        ))
    } else {
        ToolError::execution(format!(
            "no table `{table}`; existing tables: {}",
            existing.join(", ")
        ))
    }
}

/// A statement stopped at its deadline.
pub fn timed_out(timeout: std::time::Duration) -> ToolError {
    ToolError::execution(format!(
        "the query ran longer than {} s and was stopped; narrow it or add a LIMIT",
        timeout.as_secs_f64()
    ))
}

/// A statement the database refused to run because it writes.
pub fn refused_write(message: &str) -> ToolError {
    ToolError::execution(format!(
        "query_data is read-only and the database refused to write ({message}); use insert_data, create_table or drop_table to change data"
    ))
}

/// The message of a statement text with a second statement after the first.
pub const ONE_STATEMENT: &str =
    "query_data runs exactly one statement; send one SELECT without a second statement after `;`";

/// A cell's text as a query result returns it: cut at [`MAX_CELL_CHARS`].
pub fn cell_text(text: String) -> String {
    if text.chars().count() > MAX_CELL_CHARS {
        let cut: String = text.chars().take(MAX_CELL_CHARS).collect();
        format!("{cut}… [cut at {MAX_CELL_CHARS} characters]")
    } else {
        text
    }
}

/// A floating-point cell: a JSON number, or its text where JSON has none (NaN, ±∞).
pub fn float_value(f: f64) -> Value {
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(f.to_string()))
}
