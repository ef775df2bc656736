//! The scratchpad on SQLite: one database file per session namespace.
//!
//! Writes go through a normal connection. `query_data` opens a second connection
//! with `SQLITE_OPEN_READ_ONLY`, turns `query_only` on, allows no attached database
//! (so neither `ATTACH` nor `VACUUM INTO` can reach another file), and is interrupted
//! after a timeout; rusqlite refuses a second statement in the text. An authorizer
//! allows only reading: no PRAGMA but a few that describe the schema (some change
//! process-wide state, such as `hard_heap_limit`, which SQLite only lets go down),
//! no `ATTACH`, `DETACH`, transaction control or `load_extension`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadout::engine::scratchpad::{
    self as checks, ColumnInfo, ColumnType, CreateTableArgs, InsertDataArgs, QueryResult,
    RowsInserted, ScratchpadEngine, TableCreated, TableDescription, TableDropped, TableSummary,
    quoted,
};
use loadout::{BoxFuture, ToolError};
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params_from_iter};
use serde_json::Value;

/// A session's scratch database file: `<data dir>/scratchpad/<namespace>.db`.
pub struct Scratchpad {
    pub path: PathBuf,
}

impl ScratchpadEngine for Scratchpad {
    fn create_table(
        &self,
        args: CreateTableArgs,
    ) -> BoxFuture<'_, Result<TableCreated, ToolError>> {
        Box::pin(create_table(self.path.clone(), args))
    }

    fn insert_data(&self, args: InsertDataArgs) -> BoxFuture<'_, Result<RowsInserted, ToolError>> {
        Box::pin(insert_data(self.path.clone(), args))
    }

    fn query_data(
        &self,
        sql: String,
        limit: usize,
    ) -> BoxFuture<'_, Result<QueryResult, ToolError>> {
        Box::pin(query_data(self.path.clone(), sql, limit, QUERY_TIMEOUT))
    }

    fn list_tables(&self) -> BoxFuture<'_, Result<Vec<TableSummary>, ToolError>> {
        Box::pin(list_tables(self.path.clone()))
    }

    fn describe_table(&self, table: String) -> BoxFuture<'_, Result<TableDescription, ToolError>> {
        Box::pin(describe_table(self.path.clone(), table))
    }

    fn drop_table(&self, table: String) -> BoxFuture<'_, Result<TableDropped, ToolError>> {
        Box::pin(drop_table(self.path.clone(), table))
    }
}

/// How long one `query_data` statement may run.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest string or blob a query may build (SQLITE_LIMIT_LENGTH): one
/// `replace(hex(zeroblob(…)))` took 1.9 GB and ran 30 s in one step before it.
pub const MAX_VALUE_BYTES: i32 = 8 * 1024 * 1024;
/// The most memory SQLite may hold in this process, for every connection together
/// (a process-wide limit: SQLite has none per connection). A query past it fails
/// with "out of memory" instead of taking the machine's.
pub const HEAP_LIMIT_BYTES: i64 = 512 * 1024 * 1024;
/// Virtual-machine steps between two looks at the deadline.
const PROGRESS_STEPS: i32 = 1_000;
/// Largest scratch database: 64 MiB of 4 KiB pages.
const MAX_PAGE_COUNT: i64 = 16_384;

pub async fn create_table(path: PathBuf, args: CreateTableArgs) -> Result<TableCreated, ToolError> {
    checks::check_create_table(&args)?;
    let sql = create_table_sql(&args);
    let table = args.table.clone();
    blocking(move || {
        let conn = open_writer(&path)?;
        let existed = table_exists(&conn, &table)?;
        if existed && !args.if_not_exists {
            return Err(checks::already_exists(&table));
        }
        conn.execute_batch(&sql).map_err(sql_error)?;
        Ok(TableCreated {
            table,
            sql,
            created: !existed,
        })
    })
    .await
}

fn create_table_sql(args: &CreateTableArgs) -> String {
    let n_keys = args.columns.iter().filter(|c| c.primary_key).count();
    let mut parts: Vec<String> = args
        .columns
        .iter()
        .map(|column| {
            let name = quoted(&column.name);
            let mut part = format!("{name} {}", column.column_type.sql_name());
            if column.primary_key && n_keys == 1 {
                part.push_str(" PRIMARY KEY");
            }
            if column.not_null {
                part.push_str(" NOT NULL");
            }
            match column.column_type {
                ColumnType::Boolean => part.push_str(&format!(" CHECK ({name} IN (0, 1))")),
                ColumnType::Date => part.push_str(&format!(" CHECK ({name} IS date({name}))")),
                ColumnType::Text | ColumnType::Integer | ColumnType::Real => {}
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
    format!(
        "CREATE TABLE {}{} ({})",
        if args.if_not_exists {
            "IF NOT EXISTS "
        } else {
            ""
        },
        quoted(&args.table),
        parts.join(", ")
    )
}

pub async fn insert_data(path: PathBuf, args: InsertDataArgs) -> Result<RowsInserted, ToolError> {
    checks::check_identifier("table", &args.table)?;
    blocking(move || {
        let mut conn = open_writer(&path)?;
        let columns = column_names(&conn, &args.table)?;
        let tx = conn.transaction().map_err(sql_error)?;
        for (row_idx, row) in args.rows.iter().enumerate() {
            let matched = checks::row_columns(row_idx, row, &args.table, &columns)?;
            let names: Vec<String> = matched.iter().map(|(c, _)| quoted(&columns[*c])).collect();
            let values: Vec<SqlValue> = matched.iter().map(|(_, v)| json_to_sql(v)).collect();
            let placeholders: Vec<String> = (1..=values.len()).map(|i| format!("?{i}")).collect();
            let sql = format!(
                "INSERT INTO {} ({}) VALUES ({})",
                quoted(&args.table),
                names.join(", "),
                placeholders.join(", ")
            );
            let mut stmt = tx.prepare_cached(&sql).map_err(sql_error)?;
            stmt.execute(params_from_iter(values))
                .map_err(|e| ToolError::execution(format!("row {row_idx}: {}", describe(&e))))?;
        }
        tx.commit().map_err(sql_error)?;
        let n_rows_total = count_rows(&conn, &args.table)?;
        Ok(RowsInserted {
            table: args.table,
            n_inserted: args.rows.len(),
            n_rows_total,
        })
    })
    .await
}

fn json_to_sql(value: &Value) -> SqlValue {
    match value {
        Value::Null => SqlValue::Null,
        Value::Bool(b) => SqlValue::Integer(i64::from(*b)),
        Value::Number(n) => match n.as_i64() {
            Some(i) => SqlValue::Integer(i),
            None => n.as_f64().map_or(SqlValue::Null, SqlValue::Real),
        },
        Value::String(s) => SqlValue::Text(s.clone()),
        other => SqlValue::Text(other.to_string()),
    }
}

pub async fn query_data(
    path: PathBuf,
    sql: String,
    limit: usize,
    timeout: Duration,
) -> Result<QueryResult, ToolError> {
    checks::check_query(&sql)?;
    blocking(move || {
        if !path.exists() {
            // Create the (empty) database so the read-only connection can open it.
            drop(open_writer(&path)?);
        }
        let mut conn = open_read_only(&path)?;
        let refused = Arc::new(Mutex::new(None));
        let seen = refused.clone();
        conn.authorizer(Some(move |ctx: AuthContext<'_>| authorize(ctx, &seen)))
            .map_err(open_error)?;
        // SQLite asks the handler every few hundred virtual-machine steps, and stops
        // the statement once it answers true. No single step runs long: no value may
        // outgrow MAX_VALUE_BYTES (see open_read_only).
        let deadline = Instant::now() + timeout;
        conn.progress_handler(PROGRESS_STEPS, Some(move || Instant::now() >= deadline))
            .map_err(open_error)?;
        run_query(&conn, &sql, limit, timeout).map_err(|e| {
            match refused.lock().ok().and_then(|mut r| r.take()) {
                Some(what) => ToolError::execution(format!(
                    "query_data is read-only and reads only this session's tables: {what} is refused; use insert_data, create_table or drop_table to change data"
                )),
                None => e,
            }
        })
    })
    .await
}

/// Pragmas that only describe this database's schema, whatever their argument
/// (a table or index name).
const SCHEMA_PRAGMAS: [&str; 7] = [
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
];
/// Pragmas allowed when read without a value (`PRAGMA user_version`), never set.
const READ_PRAGMAS: [&str; 6] = [
    "user_version",
    "application_id",
    "page_count",
    "page_size",
    "freelist_count",
    "encoding",
];

/// What `query_data`'s SQL may do: read tables, call functions (not
/// `load_extension`) and recurse; everything else is denied while the statement is
/// prepared, and what was denied is kept in `refused` for the error message.
fn authorize(ctx: AuthContext<'_>, refused: &Mutex<Option<String>>) -> Authorization {
    let denied = match ctx.action {
        AuthAction::Select | AuthAction::Read { .. } | AuthAction::Recursive => None,
        AuthAction::Function { function_name } => {
            if function_name.eq_ignore_ascii_case("load_extension") {
                Some("load_extension".to_owned())
            } else {
                None
            }
        }
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => {
            let name = pragma_name.to_ascii_lowercase();
            let allowed = SCHEMA_PRAGMAS.contains(&name.as_str())
                || (pragma_value.is_none() && READ_PRAGMAS.contains(&name.as_str()));
            (!allowed).then(|| format!("PRAGMA {name}"))
        }
        AuthAction::Attach { .. } => {
            Some("ATTACH (query_data cannot attach other databases)".to_owned())
        }
        AuthAction::Detach { .. } => Some("DETACH".to_owned()),
        AuthAction::Transaction { .. } | AuthAction::Savepoint { .. } => {
            Some("transaction control".to_owned())
        }
        AuthAction::Insert { table_name }
        | AuthAction::Delete { table_name }
        | AuthAction::Update { table_name, .. } => Some(format!("writing to `{table_name}`")),
        _ => Some("changing the schema or the database".to_owned()),
    };
    match denied {
        None => Authorization::Allow,
        Some(what) => {
            if let Ok(mut slot) = refused.lock() {
                slot.get_or_insert(what);
            }
            Authorization::Deny
        }
    }
}

fn run_query(
    conn: &Connection,
    sql: &str,
    limit: usize,
    timeout: Duration,
) -> Result<QueryResult, ToolError> {
    let query_error = |e: rusqlite::Error| query_error(e, timeout);
    let mut stmt = conn.prepare(sql).map_err(query_error)?;
    let columns: Vec<String> = stmt.column_names().map(str::to_owned).collect();
    let n_columns = columns.len();
    let mut rows_iter = stmt.query([]).map_err(query_error)?;
    let mut rows = Vec::new();
    let mut truncated = false;
    while let Some(row) = rows_iter.next().map_err(query_error)? {
        if rows.len() == limit {
            truncated = true;
            break;
        }
        let mut values = Vec::with_capacity(n_columns);
        for idx in 0..n_columns {
            values.push(sql_to_json(row.get_ref(idx).map_err(query_error)?));
        }
        rows.push(values);
    }
    Ok(QueryResult {
        columns,
        n_rows: rows.len(),
        rows,
        truncated,
        limit,
    })
}

fn sql_to_json(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::from(i),
        ValueRef::Real(f) => checks::float_value(f),
        ValueRef::Text(bytes) => Value::String(checks::cell_text(
            String::from_utf8_lossy(bytes).into_owned(),
        )),
        ValueRef::Blob(bytes) => Value::String(format!("<blob of {} bytes>", bytes.len())),
    }
}

fn query_error(e: rusqlite::Error, timeout: Duration) -> ToolError {
    match e.sqlite_error_code() {
        Some(ErrorCode::ReadOnly) => checks::refused_write(&e.to_string()),
        Some(ErrorCode::OperationInterrupted) => checks::timed_out(timeout),
        Some(ErrorCode::TooBig) => ToolError::execution(format!(
            "the query built a value larger than {} MiB and was stopped; query_data returns data, not large computed strings",
            MAX_VALUE_BYTES / (1024 * 1024)
        )),
        Some(ErrorCode::OutOfMemory) => ToolError::execution(
            "the query needed more memory than query_data allows and was stopped; narrow it",
        ),
        _ if matches!(e, rusqlite::Error::MultipleStatement) => {
            ToolError::execution(checks::ONE_STATEMENT)
        }
        _ => {
            let message = describe(&e);
            if message.contains("too many attached databases") {
                ToolError::execution(
                    "query_data cannot attach other databases (ATTACH and VACUUM INTO are refused)",
                )
            } else {
                ToolError::execution(format!("query failed: {message}"))
            }
        }
    }
}

pub async fn list_tables(path: PathBuf) -> Result<Vec<TableSummary>, ToolError> {
    blocking(move || {
        if !path.exists() {
            return Ok(Vec::new());
        }
        let conn = open_writer(&path)?;
        let mut tables = Vec::new();
        for table in table_names(&conn)? {
            tables.push(TableSummary {
                n_rows: count_rows(&conn, &table)?,
                columns: column_names(&conn, &table)?,
                table,
            });
        }
        Ok(tables)
    })
    .await
}

pub async fn describe_table(path: PathBuf, table: String) -> Result<TableDescription, ToolError> {
    checks::check_identifier("table", &table)?;
    blocking(move || {
        let conn = open_writer(&path)?;
        let sql: Option<String> = conn
            .query_row(
                "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
                [&table],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql_error)?;
        let Some(sql) = sql else {
            return Err(no_such_table(&conn, &table));
        };
        let mut stmt = conn
            .prepare(&format!("PRAGMA table_info({})", quoted(&table)))
            .map_err(sql_error)?;
        let columns = stmt
            .query_map([], |r| {
                Ok(ColumnInfo {
                    name: r.get(1)?,
                    column_type: r.get(2)?,
                    not_null: r.get(3)?,
                    default: r.get(4)?,
                    primary_key: r.get::<_, i64>(5)? > 0,
                })
            })
            .map_err(sql_error)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql_error)?;
        Ok(TableDescription {
            n_rows: count_rows(&conn, &table)?,
            table,
            columns,
            sql,
        })
    })
    .await
}

pub async fn drop_table(path: PathBuf, table: String) -> Result<TableDropped, ToolError> {
    checks::check_identifier("table", &table)?;
    blocking(move || {
        let conn = open_writer(&path)?;
        if !table_exists(&conn, &table)? {
            return Err(no_such_table(&conn, &table));
        }
        let n_rows_deleted = count_rows(&conn, &table)?;
        conn.execute_batch(&format!("DROP TABLE {}", quoted(&table)))
            .map_err(sql_error)?;
        Ok(TableDropped {
            table,
            n_rows_deleted,
        })
    })
    .await
}

// ---------------------------------------------------------------------------
// Connections and helpers

async fn blocking<R, F>(f: F) -> Result<R, ToolError>
where
    F: FnOnce() -> Result<R, ToolError> + Send + 'static,
    R: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::execution(format!("scratchpad task failed: {e}")))?
}

fn open_writer(path: &Path) -> Result<Connection, ToolError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| ToolError::Storage(format!("cannot create {}: {e}", dir.display())))?;
    }
    let mut conn = Connection::open(path).map_err(open_error)?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(open_error)?;
    // Writes wait for another writer (busy_timeout) instead of failing: see the
    // store's request connection.
    conn.set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
    conn.pragma_update(None, "trusted_schema", "OFF")
        .map_err(open_error)?;
    conn.pragma_update(None, "max_page_count", MAX_PAGE_COUNT)
        .map_err(open_error)?;
    conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)
        .map_err(open_error)?;
    Ok(conn)
}

/// The connection `query_data` uses: SQLite itself refuses every write on it.
pub(crate) fn open_read_only(path: &Path) -> Result<Connection, ToolError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(open_error)?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(open_error)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(open_error)?;
    conn.pragma_update(None, "trusted_schema", "OFF")
        .map_err(open_error)?;
    conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)
        .map_err(open_error)?;
    conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        .map_err(open_error)?;
    // Sorts and temporary tables spill to disk past a small cache.
    conn.pragma_update(None, "cache_size", -8_192)
        .map_err(open_error)?;
    conn.pragma_update(None, "hard_heap_limit", HEAP_LIMIT_BYTES)
        .map_err(open_error)?;
    Ok(conn)
}

fn open_error(e: rusqlite::Error) -> ToolError {
    ToolError::Storage(format!("cannot open the scratchpad database: {e}"))
}

fn sql_error(e: rusqlite::Error) -> ToolError {
    ToolError::execution(describe(&e))
}

/// The message SQLite gave, without rusqlite's wrapping.
fn describe(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(code, Some(message)) => {
            if code.code == ErrorCode::DiskFull {
                format!("{message} (the scratchpad is limited to 64 MiB)")
            } else {
                message.clone()
            }
        }
        other => other.to_string(),
    }
}

fn table_names(conn: &Connection) -> Result<Vec<String>, ToolError> {
    let mut stmt = conn
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name",
        )
        .map_err(sql_error)?;
    let names = stmt
        .query_map([], |r| r.get(0))
        .map_err(sql_error)?
        .collect::<Result<Vec<String>, _>>()
        .map_err(sql_error)?;
    Ok(names)
}

fn table_exists(conn: &Connection, table: &str) -> Result<bool, ToolError> {
    conn.query_row(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
        [table],
        |_| Ok(()),
    )
    .optional()
    .map(|found| found.is_some())
    .map_err(sql_error)
}

fn no_such_table(conn: &Connection, table: &str) -> ToolError {
    checks::no_such_table(table, &table_names(conn).unwrap_or_default())
}

/// Column names of a table, in order; a clear error when the table does not exist.
fn column_names(conn: &Connection, table: &str) -> Result<Vec<String>, ToolError> {
    let mut stmt = conn
        .prepare(&format!("PRAGMA table_info({})", quoted(table)))
        .map_err(sql_error)?;
    let names = stmt
        .query_map([], |r| r.get(1))
        .map_err(sql_error)?
        .collect::<Result<Vec<String>, _>>()
        .map_err(sql_error)?;
    if names.is_empty() {
        return Err(no_such_table(conn, table));
    }
    Ok(names)
}

fn count_rows(conn: &Connection, table: &str) -> Result<i64, ToolError> {
    conn.query_row(
        &format!("SELECT count(*) FROM {}", quoted(table)),
        [],
        |r| r.get(0),
    )
    .map_err(sql_error)
}
