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

use std::collections::{HashMap, HashSet};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use loadout::ToolError;
use loadout_store::deadpool_postgres::Object;
use loadout_store::tokio_postgres::types::{FromSql, Type};
use loadout_store::tokio_postgres::{self, Row};
use loadout_store::{PostgresStore, StoreError};
use serde_json::Value;

use loadout::BoxFuture;

use crate::{
    ColumnInfo, ColumnType, CreateTableArgs, InsertDataArgs, MAX_COLUMNS, QueryResult,
    RowsInserted, ScratchpadEngine, TableCreated, TableDescription, TableDropped, TableSummary,
    check_identifier, quoted,
};

/// How long one `query_data` statement may run.
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

pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Memory for each sort or hash of a `query_data` statement before it spills to disk.
const QUERY_WORK_MEM: &str = "16MB";
/// Longest text returned in one cell of a query result, in characters.
const MAX_CELL_CHARS: usize = 10_000;

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
    let mut seen = HashSet::new();
    for column in &mut args.columns {
        check_identifier("column", &column.name)?;
        column.name = column.name.to_ascii_lowercase();
        if !seen.insert(column.name.clone()) {
            return Err(ToolError::execution(format!(
                "column `{}` is listed twice",
                column.name
            )));
        }
    }
    let table = args.table.to_ascii_lowercase();
    let sql = create_table_sql(&table, &args);
    let schema = schema_name(namespace);
    let mut client = store.client().await?;
    let tx = client.transaction().await.map_err(|e| pg_error(store, e))?;
    tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", quoted(&schema)))
        .await
        .map_err(|e| pg_error(store, e))?;
    set_search_path(&tx, &schema)
        .await
        .map_err(|e| pg_error(store, e))?;
    let existed = table_exists(&tx, &table)
        .await
        .map_err(|e| pg_error(store, e))?;
    if existed && !args.if_not_exists {
        return Err(ToolError::execution(format!(
            "table `{table}` already exists; use describe_table to see it, drop_table to replace it, or pass if_not_exists"
        )));
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
    check_identifier("table", &args.table)?;
    let table = args.table.to_ascii_lowercase();
    let schema = schema_name(namespace);
    let mut client = store.client().await?;
    let tx = client.transaction().await.map_err(|e| pg_error(store, e))?;
    set_search_path(&tx, &schema)
        .await
        .map_err(|e| pg_error(store, e))?;
    let columns = columns(&tx, &table).await.map_err(|e| pg_error(store, e))?;
    if columns.is_empty() {
        return Err(no_such_table(&tx, &table).await);
    }
    for (row_idx, row) in args.rows.iter().enumerate() {
        if row.is_empty() {
            return Err(ToolError::execution(format!(
                "row {row_idx} is an empty object; give at least one column"
            )));
        }
        let mut names = Vec::with_capacity(row.len());
        let mut casts = Vec::with_capacity(row.len());
        let mut values: Vec<Option<String>> = Vec::with_capacity(row.len());
        for (key, value) in row {
            // Only names the table really has reach SQL, matched case-insensitively.
            let Some(column) = columns.iter().find(|c| c.name.eq_ignore_ascii_case(key)) else {
                return Err(ToolError::execution(format!(
                    "row {row_idx}: table `{table}` has no column `{}`; columns: {}",
                    key.chars().take(64).collect::<String>(),
                    columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
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

pub async fn query_data(
    store: &PostgresStore,
    namespace: &str,
    sql: String,
    limit: usize,
    timeout: Duration,
) -> Result<QueryResult, ToolError> {
    if sql.trim().is_empty() {
        return Err(ToolError::execution("the query is empty"));
    }
    if let Some(what) = refused_statement(&sql) {
        return Err(ToolError::execution(format!(
            "query_data is read-only and reads only this session's tables: {what} is refused"
        )));
    }
    let role = query_role(store).await?;
    let schema = schema_name(namespace);
    let mut client = store.client().await?;
    let result = run_query(&mut client, &role, &schema, &sql, limit, timeout).await;
    // The connection ran caller-written SQL: whatever session state that left
    // behind (advisory locks, prepared statements, settings) goes with it.
    drop(Object::take(client));
    result.map_err(|e| match e {
        QueryFailure::NoRows => ToolError::execution(
            "query_data is read-only: it runs one statement that returns rows (SELECT, VALUES, TABLE, WITH … SELECT, EXPLAIN, SHOW); use insert_data, create_table or drop_table to change data",
        ),
        QueryFailure::Pg(e) => query_error(store, e, timeout),
    })
}

enum QueryFailure {
    /// The statement returns no rows: it could only be run outside the function
    /// that confines the query role, so it is not run at all.
    NoRows,
    Pg(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for QueryFailure {
    fn from(e: tokio_postgres::Error) -> Self {
        QueryFailure::Pg(e)
    }
}

async fn run_query(
    client: &mut Object,
    role: &str,
    schema: &str,
    sql: &str,
    limit: usize,
    timeout: Duration,
) -> Result<QueryResult, QueryFailure> {
    let tx = client.transaction().await?;
    // First, so that waiting for another query's grants (below) is bounded too.
    // work_mem bounds each sort and hash of the query in the server's memory (past
    // it they spill to disk), for every query of every session alike.
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {}; SET LOCAL work_mem = '{QUERY_WORK_MEM}'",
        timeout.as_millis().max(1)
    ))
    .await?;
    set_search_path(&tx, schema).await?;
    let role = quote_ident(role);
    let mut enter = String::new();
    let schema_exists = tx
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1",
            &[&schema],
        )
        .await?
        .is_some();
    if schema_exists {
        // Granted inside this transaction, which is always rolled back: the role
        // never holds a privilege outside a query of this namespace, and a
        // concurrent query of another namespace cannot see these grants.
        enter.push_str(&format!(
            "GRANT USAGE ON SCHEMA {schema} TO {role}; \
             GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}; ",
            schema = quoted(schema)
        ));
    }
    // Read-only from here on: a transaction may drop to read-only after writing,
    // and nothing may make it read-write again once a query has run.
    enter.push_str(&format!("SET TRANSACTION READ ONLY; SET LOCAL ROLE {role}"));
    tx.batch_execute(&enter).await?;
    // The extended protocol: the server refuses a second statement in the text.
    // Parsed (never run) as the query role, to learn the result's columns.
    let stmt = tx.prepare(sql).await?;
    if stmt.columns().is_empty() {
        return Err(QueryFailure::NoRows);
    }
    let columns: Vec<String> = stmt.columns().iter().map(|c| c.name().to_owned()).collect();
    let native: Option<Vec<&'static str>> = stmt
        .columns()
        .iter()
        .map(|c| native_type(c.type_()))
        .collect();
    let (inner, types) = match native {
        Some(types) => (sql.to_owned(), types),
        None => {
            // Some column has a type without a JSON mapping here: read the same
            // query with every column cast to text.
            let casts: Vec<String> = (1..=columns.len())
                .map(|i| format!("q.c{i}::text"))
                .collect();
            let aliases: Vec<String> = (1..=columns.len()).map(|i| format!("c{i}")).collect();
            let wrapped = format!(
                "SELECT {} FROM (\n{}\n) AS q({})",
                casts.join(", "),
                sql.trim_end().trim_end_matches(';'),
                aliases.join(", ")
            );
            (wrapped, vec!["pg_catalog.text"; columns.len()])
        }
    };
    // The caller's SQL runs only inside `run_query`, a SECURITY DEFINER function
    // owned by the query role: there PostgreSQL refuses `SET ROLE`, `RESET ROLE`
    // and `set_config('role', …)`, which would otherwise take the session back to
    // the role loadout logged in as.
    let definitions: Vec<String> = types
        .iter()
        .enumerate()
        .map(|(i, ty)| format!("c{} {ty}", i + 1))
        .collect();
    let outer = format!(
        "SELECT * FROM {QUERY_SCHEMA}.run_query($1::text, $2::bigint) AS t({})",
        definitions.join(", ")
    );
    let stmt = tx.prepare(&outer).await?;
    let max_rows = i64::try_from(limit + 1).unwrap_or(i64::MAX);
    let portal = tx.bind(&stmt, &[&inner, &max_rows]).await?;
    let fetched = tx
        .query_portal(&portal, i32::try_from(limit + 1).unwrap_or(i32::MAX))
        .await?;
    let truncated = fetched.len() > limit;
    let mut rows = Vec::with_capacity(fetched.len().min(limit));
    for row in fetched.iter().take(limit) {
        let mut values = Vec::with_capacity(columns.len());
        for idx in 0..columns.len() {
            values.push(cell_to_json(row, idx)?);
        }
        rows.push(values);
    }
    tx.rollback().await?;
    Ok(QueryResult {
        columns,
        n_rows: rows.len(),
        rows,
        truncated,
        limit,
    })
}

/// Statements `query_data` refuses before the database sees them: they change the
/// session (whose connection other work may have used before it is dropped) or the
/// server, or reach files and other databases.
const REFUSED_STATEMENTS: [&str; 12] = [
    "set",
    "reset",
    "copy",
    "load",
    "do",
    "call",
    "listen",
    "notify",
    "discard",
    "lock",
    "vacuum",
    "checkpoint",
];
/// Functions that read or write server files, reach other databases, change
/// settings or signal backends, and those that run SQL given as text (which would
/// hide a call of the others from this check). The query role holds no privilege
/// for most of them; refusing the names as well keeps that from being the only guard.
const REFUSED_FUNCTIONS: [&str; 30] = [
    "pg_read_file",
    "pg_read_binary_file",
    "pg_ls_dir",
    "pg_stat_file",
    "pg_file_write",
    "lo_import",
    "lo_export",
    "lo_from_bytea",
    "lo_put",
    "lo_open",
    "dblink",
    "dblink_exec",
    "dblink_connect",
    "dblink_send_query",
    "set_config",
    "pg_reload_conf",
    "pg_rotate_logfile",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_sleep",
    "pg_sleep_for",
    "pg_sleep_until",
    "pg_advisory_lock",
    "pg_advisory_xact_lock",
    "query_to_xml",
    "query_to_xml_and_xmlschema",
    "query_to_xmlschema",
    "cursor_to_xml",
    "database_to_xml",
    "pg_logical_emit_message",
];

/// What in `sql` is refused, if anything: the statement's first word, then every
/// identifier, outside string literals, dollar quotes and comments (unquoted words
/// folded to lowercase, as PostgreSQL does).
fn refused_statement(sql: &str) -> Option<String> {
    let words = sql_words(sql);
    if words.iter().any(|w| w == UNICODE_IDENTIFIER) {
        return Some("a Unicode-escaped identifier (U&\"…\")".to_owned());
    }
    if let Some(first) = words.first()
        && REFUSED_STATEMENTS.contains(&first.as_str())
    {
        return Some(first.to_ascii_uppercase());
    }
    words
        .iter()
        .find(|w| REFUSED_FUNCTIONS.contains(&w.as_str()))
        .map(|w| format!("{w}()"))
}

/// Stands for a `U&"…"` identifier among [`sql_words`]' words (no identifier has a
/// space).
const UNICODE_IDENTIFIER: &str = "u& identifier";

/// The identifiers and keywords of `sql`, in order.
fn sql_words(sql: &str) -> Vec<String> {
    let chars: Vec<char> = sql.chars().collect();
    let mut words = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '-' && next == Some('-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest in PostgreSQL.
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '\'' {
            // A literal; E'…' strings may escape a quote with a backslash.
            let escapes = i > 0 && matches!(chars[i - 1], 'e' | 'E');
            i += 1;
            while i < chars.len() {
                if escapes && chars[i] == '\\' {
                    i += 2;
                } else if chars[i] == '\'' {
                    if chars.get(i + 1) == Some(&'\'') {
                        i += 2;
                    } else {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            i += 1;
        } else if c == '"' {
            // `U&"\0070g_read_file"` spells a name this check would not see.
            if i >= 2 && chars[i - 1] == '&' && matches!(chars[i - 2], 'u' | 'U') {
                words.push(UNICODE_IDENTIFIER.to_owned());
            }
            let mut word = String::new();
            i += 1;
            while i < chars.len() {
                if chars[i] == '"' {
                    if chars.get(i + 1) == Some(&'"') {
                        word.push('"');
                        i += 2;
                        continue;
                    }
                    break;
                }
                word.push(chars[i]);
                i += 1;
            }
            i += 1;
            words.push(word);
        } else if c == '$' && !(i > 0 && is_word_char(chars[i - 1])) {
            // A dollar quote `$tag$…$tag$` (or a parameter `$1`, which has no tag end).
            let tag_end = chars[i + 1..]
                .iter()
                .position(|ch| !is_word_char(*ch))
                .map(|p| i + 1 + p);
            match tag_end {
                Some(end) if chars[end] == '$' => {
                    let tag = &chars[i..=end];
                    let mut j = end + 1;
                    while j < chars.len() && !chars[j..].starts_with(tag) {
                        j += 1;
                    }
                    i = j + tag.len();
                }
                _ => i += 1,
            }
        } else if is_word_char(c) && !c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && (is_word_char(chars[i]) || chars[i] == '$') {
                i += 1;
            }
            words.push(chars[start..i].iter().collect::<String>().to_lowercase());
        } else {
            i += 1;
        }
    }
    words
}

fn is_word_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The schema of `run_query`. No namespace maps to it: theirs start with
/// `scratchpad_` or `scratchpadh_`.
const QUERY_SCHEMA: &str = "loadout_scratchpad";

/// Query roles already set up by this process, by store URL (password masked).
static QUERY_ROLES: LazyLock<Mutex<HashMap<String, String>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The NOLOGIN role `query_data` runs as, set up on first use: it owns
/// `run_query` and nothing else, and is granted read access to one namespace's
/// schema only inside the query's own transaction. Creating it needs CREATEROLE
/// once; an administrator may create it instead (see [`missing_role_error`]).
async fn query_role(store: &PostgresStore) -> Result<String, ToolError> {
    let key = store.url_masked().to_owned();
    if let Some(role) = lock_roles().get(&key) {
        return Ok(role.clone());
    }
    let client = store.client().await?;
    let me = client
        .query_one(
            "SELECT current_user::text, rolsuper OR rolcreaterole
             FROM pg_catalog.pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .map_err(|e| pg_error(store, e))?;
    let user: String = me.try_get(0).map_err(|e| pg_error(store, e))?;
    let may_create_roles: bool = me.try_get(1).map_err(|e| pg_error(store, e))?;
    let role = query_role_name(&user);
    let existing = client
        .query_opt(
            "SELECT r.rolcanlogin OR r.rolsuper OR r.rolcreaterole OR r.rolcreatedb
                    OR r.rolreplication OR r.rolbypassrls
                    OR EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m WHERE m.member = r.oid),
                    pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')
             FROM pg_catalog.pg_roles r WHERE r.rolname = $1",
            &[&role],
        )
        .await
        .map_err(|e| pg_error(store, e))?;
    match existing {
        None if !may_create_roles => return Err(missing_role_error(&user, &role, true)),
        Some(row) => {
            let privileged: bool = row.try_get(0).map_err(|e| pg_error(store, e))?;
            let member: bool = row.try_get(1).map_err(|e| pg_error(store, e))?;
            if privileged {
                return Err(ToolError::execution(format!(
                    "query_data refuses to run as role `{role}`: it exists but is not a bare NOLOGIN role (it can log in, has a role attribute, or is a member of another role); drop it and let loadout create it, or recreate it with `CREATE ROLE {} NOLOGIN`",
                    quote_ident(&role)
                )));
            }
            if !member && !may_create_roles {
                return Err(missing_role_error(&user, &role, false));
            }
        }
        None => {}
    }
    drop(client);
    store
        .ensure_schema("scratchpad/query-role/1", &query_role_setup_sql(&role))
        .await
        .map_err(|e| match e {
            StoreError::Database(message) => ToolError::execution(format!(
                "cannot set up the role query_data runs as (`{role}`): {message}"
            )),
            other => other.into(),
        })?;
    check_reads_nothing(store, &role).await?;
    lock_roles().insert(key, role.clone());
    Ok(role)
}

fn lock_roles() -> std::sync::MutexGuard<'static, HashMap<String, String>> {
    QUERY_ROLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// `<user>_loadout_query`; roles are shared by the whole server, so one query role
/// serves every database the same user runs loadout on.
fn query_role_name(user: &str) -> String {
    const SUFFIX: &str = "_loadout_query";
    if user.len() + SUFFIX.len() <= 63 {
        format!("{user}{SUFFIX}")
    } else {
        format!("loadout_query_{:016x}", fnv1a(user.as_bytes()))
    }
}

fn missing_role_error(user: &str, role: &str, create: bool) -> ToolError {
    let (role_q, user_q) = (quote_ident(role), quote_ident(user));
    let steps = if create {
        format!("CREATE ROLE {role_q} NOLOGIN; GRANT {role_q} TO {user_q};")
    } else {
        format!("GRANT {role_q} TO {user_q};")
    };
    ToolError::execution(format!(
        "query_data on PostgreSQL runs caller SQL as role `{role}`, which can read only the session's scratchpad tables, and role `{user}` may not {} it (it lacks CREATEROLE). Either `ALTER ROLE {user_q} CREATEROLE`, or as an administrator run: {steps}",
        if create { "create" } else { "join" }
    ))
}

/// Idempotent; run under the store's schema lock so that replicas on one database
/// do not race. Replicas on other databases of the same server may create the role
/// at the same moment: a duplicate is ignored.
fn query_role_setup_sql(role: &str) -> String {
    let ident = quote_ident(role);
    let lit = literal(role);
    format!(
        r#"
DO $setup$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = {lit}) THEN
        BEGIN
            CREATE ROLE {ident} NOLOGIN;
            COMMENT ON ROLE {ident} IS 'loadout: runs scratchpad query_data; owns only {QUERY_SCHEMA}.run_query and must be granted nothing';
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
    -- Needed to make the role own run_query (ALTER FUNCTION … OWNER).
    IF NOT pg_catalog.pg_has_role(current_user, {lit}, 'USAGE') THEN
        BEGIN
            GRANT {ident} TO CURRENT_USER;
        EXCEPTION WHEN unique_violation THEN
            NULL;
        END;
    END IF;
END
$setup$;
CREATE SCHEMA IF NOT EXISTS {QUERY_SCHEMA};
CREATE OR REPLACE FUNCTION {QUERY_SCHEMA}.run_query(query text, max_rows bigint)
RETURNS SETOF record LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    r record;
    n bigint := 0;
BEGIN
    IF max_rows < 1 THEN
        RETURN;
    END IF;
    -- A cursor underneath: stops reading after max_rows rows.
    FOR r IN EXECUTE query LOOP
        RETURN NEXT r;
        n := n + 1;
        EXIT WHEN n >= max_rows;
    END LOOP;
END
$fn$;
GRANT USAGE, CREATE ON SCHEMA {QUERY_SCHEMA} TO {ident};
ALTER FUNCTION {QUERY_SCHEMA}.run_query(text, bigint) OWNER TO {ident};
REVOKE CREATE ON SCHEMA {QUERY_SCHEMA} FROM {ident};
REVOKE ALL ON FUNCTION {QUERY_SCHEMA}.run_query(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {QUERY_SCHEMA}.run_query(text, bigint) TO {ident};
"#
    )
}

/// Refuses to use a query role that can read any table on its own, whether the
/// grant names it or PUBLIC (PostgreSQL grants PUBLIC no table access by default,
/// but an operator may have): query_data would expose that table.
async fn check_reads_nothing(store: &PostgresStore, role: &str) -> Result<(), ToolError> {
    let client = store.client().await?;
    let readable = client
        .query(
            "SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
             FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relkind IN ('r', 'v', 'm', 'p', 'f')
               AND n.nspname NOT IN ('pg_catalog', 'information_schema')
               AND pg_catalog.has_table_privilege($1, c.oid, 'SELECT')
             ORDER BY 1 LIMIT 5",
            &[&role],
        )
        .await
        .map_err(|e| pg_error(store, e))?;
    if readable.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = readable
        .iter()
        .filter_map(|row| row.try_get::<_, String>(0).ok())
        .collect();
    Err(ToolError::execution(format!(
        "query_data is disabled: its role `{role}` can read {} (granted to it or to PUBLIC); revoke that (e.g. `REVOKE SELECT ON {} FROM PUBLIC`) so that caller SQL reads only the session's tables",
        names.join(", "),
        names.first().map_or("…", String::as_str)
    )))
}

/// Quotes any identifier (role names come from the server, not from checked input).
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The type to declare for a column `cell_to_json` decodes natively; `None` for
/// the rest, which are read as text.
fn native_type(ty: &Type) -> Option<&'static str> {
    Some(match *ty {
        Type::BOOL => "pg_catalog.bool",
        Type::INT2 => "pg_catalog.int2",
        Type::INT4 => "pg_catalog.int4",
        Type::INT8 => "pg_catalog.int8",
        Type::OID => "pg_catalog.oid",
        Type::FLOAT4 => "pg_catalog.float4",
        Type::FLOAT8 => "pg_catalog.float8",
        Type::NUMERIC => "pg_catalog.numeric",
        Type::TEXT => "pg_catalog.text",
        Type::VARCHAR => "pg_catalog.varchar",
        Type::BPCHAR => "pg_catalog.bpchar",
        Type::NAME => "pg_catalog.name",
        Type::DATE => "pg_catalog.date",
        _ => return None,
    })
}

fn cell_to_json(row: &Row, idx: usize) -> Result<Value, tokio_postgres::Error> {
    let ty = row.columns()[idx].type_().clone();
    Ok(match ty {
        Type::BOOL => row
            .try_get::<_, Option<bool>>(idx)?
            .map_or(Value::Null, Value::from),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(idx)?
            .map_or(Value::Null, Value::from),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(idx)?
            .map_or(Value::Null, Value::from),
        Type::INT8 => row
            .try_get::<_, Option<i64>>(idx)?
            .map_or(Value::Null, Value::from),
        Type::OID => row
            .try_get::<_, Option<u32>>(idx)?
            .map_or(Value::Null, Value::from),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(idx)?
            .map_or(Value::Null, |f| float_to_json(f64::from(f))),
        Type::FLOAT8 => row
            .try_get::<_, Option<f64>>(idx)?
            .map_or(Value::Null, float_to_json),
        Type::NUMERIC => row
            .try_get::<_, Option<Numeric>>(idx)?
            .map_or(Value::Null, |n| n.0),
        Type::DATE => row
            .try_get::<_, Option<PgDate>>(idx)?
            .map_or(Value::Null, |d| Value::String(d.0)),
        _ => row
            .try_get::<_, Option<String>>(idx)?
            .map_or(Value::Null, |text| Value::String(cut_cell(text))),
    })
}

fn float_to_json(f: f64) -> Value {
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(f.to_string()))
}

fn cut_cell(text: String) -> String {
    if text.chars().count() > MAX_CELL_CHARS {
        let cut: String = text.chars().take(MAX_CELL_CHARS).collect();
        format!("{cut}… [cut at {MAX_CELL_CHARS} characters]")
    } else {
        text
    }
}

/// A `numeric` value decoded from the binary format: a JSON number when it is an
/// integer that fits `i64` or converts to `f64` exactly enough, else its text.
struct Numeric(Value);

impl<'a> FromSql<'a> for Numeric {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let text = numeric_text(raw).ok_or("malformed numeric value")?;
        let value = if let Ok(i) = text.parse::<i64>() {
            Value::from(i)
        } else if let Some(number) = text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
        {
            Value::Number(number)
        } else {
            Value::String(text)
        };
        Ok(Numeric(value))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }
}

/// The decimal text of a binary `numeric`: ndigits, weight, sign, dscale, then
/// base-10000 digits.
fn numeric_text(raw: &[u8]) -> Option<String> {
    let word = |idx: usize| -> Option<u16> {
        Some(u16::from_be_bytes([
            *raw.get(idx * 2)?,
            *raw.get(idx * 2 + 1)?,
        ]))
    };
    let n_digits = usize::from(word(0)?);
    let weight = i32::from(word(1)? as i16);
    let sign = word(2)?;
    let dscale = usize::from(word(3)?);
    match sign {
        0x0000 | 0x4000 => {}
        0xC000 => return Some("NaN".into()),
        0xD000 => return Some("Infinity".into()),
        0xF000 => return Some("-Infinity".into()),
        _ => return None,
    }
    let digits: Vec<u16> = (0..n_digits).map(|i| word(4 + i)).collect::<Option<_>>()?;
    let mut int_part = String::new();
    let mut frac_part = String::new();
    for pos in 0..=weight.max(-1) {
        let digit = usize::try_from(pos)
            .ok()
            .and_then(|p| digits.get(p))
            .copied()
            .unwrap_or(0);
        if int_part.is_empty() {
            if digit != 0 {
                int_part = digit.to_string();
            }
        } else {
            int_part.push_str(&format!("{digit:04}"));
        }
    }
    if int_part.is_empty() {
        int_part.push('0');
    }
    if dscale > 0 {
        let mut pos = weight + 1;
        while frac_part.len() < dscale {
            let digit = if pos < 0 {
                0
            } else {
                usize::try_from(pos)
                    .ok()
                    .and_then(|p| digits.get(p))
                    .copied()
                    .unwrap_or(0)
            };
            frac_part.push_str(&format!("{digit:04}"));
            pos += 1;
        }
        frac_part.truncate(dscale);
    }
    let mut text = String::new();
    if sign == 0x4000 {
        text.push('-');
    }
    text.push_str(&int_part);
    if !frac_part.is_empty() {
        text.push('.');
        text.push_str(&frac_part);
    }
    Some(text)
}

/// A `date` as `YYYY-MM-DD` (binary format: days since 2000-01-01).
struct PgDate(String);

impl<'a> FromSql<'a> for PgDate {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let bytes: [u8; 4] = raw.try_into().map_err(|_| "malformed date value")?;
        let days = i32::from_be_bytes(bytes);
        Ok(PgDate(match days {
            i32::MAX => "infinity".into(),
            i32::MIN => "-infinity".into(),
            days => civil_from_days(i64::from(days) + 10_957),
        }))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::DATE
    }
}

/// Days since 1970-01-01 to `YYYY-MM-DD` (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

fn query_error(store: &PostgresStore, e: tokio_postgres::Error, timeout: Duration) -> ToolError {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let message = loadout_store::describe_pg_error(&e);
        return match code {
            // read_only_sql_transaction
            "25006" => ToolError::execution(format!(
                "query_data is read-only and the database refused to write ({message}); use insert_data, create_table or drop_table to change data"
            )),
            // query_canceled (statement_timeout)
            "57014" => ToolError::execution(format!(
                "the query ran longer than {} s and was stopped; narrow it or add a LIMIT",
                timeout.as_secs_f64()
            )),
            // syntax_error for "cannot insert multiple commands into a prepared statement"
            "42601" if message.contains("multiple commands") => ToolError::execution(
                "query_data runs exactly one statement; send one SELECT without a second statement after `;`",
            ),
            // insufficient_privilege: the query role may only read this session's
            // tables (and write nothing).
            "42501" => ToolError::execution(format!(
                "query_data is read-only and reads only this session's scratchpad tables; the database refused: {message}"
            )),
            _ => ToolError::execution(format!("query failed: {message}")),
        };
    }
    pg_error(store, e)
}

pub async fn list_tables(
    store: &PostgresStore,
    namespace: &str,
) -> Result<Vec<TableSummary>, ToolError> {
    let schema = schema_name(namespace);
    let mut client = store.client().await?;
    let tx = client.transaction().await.map_err(|e| pg_error(store, e))?;
    set_search_path(&tx, &schema)
        .await
        .map_err(|e| pg_error(store, e))?;
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
    check_identifier("table", &table)?;
    let table = table.to_ascii_lowercase();
    let schema = schema_name(namespace);
    let mut client = store.client().await?;
    let tx = client.transaction().await.map_err(|e| pg_error(store, e))?;
    set_search_path(&tx, &schema)
        .await
        .map_err(|e| pg_error(store, e))?;
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
    check_identifier("table", &table)?;
    let table = table.to_ascii_lowercase();
    let schema = schema_name(namespace);
    let mut client = store.client().await?;
    let tx = client.transaction().await.map_err(|e| pg_error(store, e))?;
    set_search_path(&tx, &schema)
        .await
        .map_err(|e| pg_error(store, e))?;
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

/// `search_path` for the rest of the transaction: the namespace's schema only
/// (`pg_catalog` is always searched first).
async fn set_search_path(
    tx: &tokio_postgres::Transaction<'_>,
    schema: &str,
) -> Result<(), tokio_postgres::Error> {
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

/// The table's columns in order; empty when the schema has no such table.
async fn columns(
    tx: &tokio_postgres::Transaction<'_>,
    table: &str,
) -> Result<Vec<Column>, tokio_postgres::Error> {
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

async fn table_names(
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<Vec<String>, tokio_postgres::Error> {
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

async fn table_exists(
    tx: &tokio_postgres::Transaction<'_>,
    table: &str,
) -> Result<bool, tokio_postgres::Error> {
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

async fn no_such_table(tx: &tokio_postgres::Transaction<'_>, table: &str) -> ToolError {
    let existing = table_names(tx).await.unwrap_or_default();
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

async fn count_rows(
    tx: &tokio_postgres::Transaction<'_>,
    table: &str,
) -> Result<i64, tokio_postgres::Error> {
    tx.query_one(&format!("SELECT count(*) FROM {}", quoted(table)), &[])
        .await?
        .try_get(0)
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    /// N1 of issue 36: statements that change the session or the server, and
    /// functions that reach files or other databases, are refused before they run,
    /// however they are spelled.
    #[test]
    fn refused_statements_are_found_outside_literals() {
        for sql in [
            "SET work_mem = '1TB'",
            "  reset ALL",
            "/* x */ COPY people TO PROGRAM 'id'",
            "-- c\nset statement_timeout = 0",
            "SELECT pg_read_file('/etc/passwd')",
            "SELECT PG_READ_BINARY_FILE('x')",
            "SELECT \"pg_ls_dir\"('.')",
            "SELECT pg_catalog.lo_import('/etc/passwd')",
            "SELECT * FROM dblink('host=x', 'select 1') AS t(a int)",
            "SELECT set_config('statement_timeout', '0', false)",
            "SELECT query_to_xml('select pg_read_file(''x'')', true, true, '')",
            "SELECT $$x$$, pg_sleep(100)",
            "SELECT U&\"\\0070g_read_file\"('x')",
        ] {
            assert!(refused_statement(sql).is_some(), "{sql}");
        }
        for sql in [
            "SELECT 'set', 'pg_read_file(x)' FROM people",
            "SELECT name AS \"copy\" FROM people -- pg_read_file(",
            "SELECT $tag$ pg_read_file $tag$, E'it\\'s dblink'",
            "WITH settings AS (SELECT 1) SELECT * FROM settings",
            "SELECT /* set /* nested */ copy */ 1",
            "SHOW work_mem",
        ] {
            assert_eq!(refused_statement(sql), None, "{sql}");
        }
    }

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
    fn dates_and_numerics_decode() {
        assert_eq!(civil_from_days(0), "1970-01-01");
        assert_eq!(civil_from_days(10_957), "2000-01-01");
        assert_eq!(civil_from_days(11_322), "2000-12-31");
        assert_eq!(civil_from_days(-1), "1969-12-31");
        assert!(is_iso_date("2001-12-31"));
        assert!(!is_iso_date("31/12/2001"));
        assert!(!is_iso_date("2001-1-31"));
        // 12345.678 with dscale 3: weight 1, digits [1, 2345, 6780].
        let raw: Vec<u8> = [3u16, 1, 0, 3, 1, 2345, 6780]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect();
        assert_eq!(numeric_text(&raw).as_deref(), Some("12345.678"));
        // -0.05 with dscale 2: weight -1, digits [500].
        let raw: Vec<u8> = [1u16, 0xFFFF, 0x4000, 2, 500]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect();
        assert_eq!(numeric_text(&raw).as_deref(), Some("-0.05"));
        // 0 with no digits.
        let raw: Vec<u8> = [0u16, 0, 0, 0]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect();
        assert_eq!(numeric_text(&raw).as_deref(), Some("0"));
        assert_eq!(numeric_text(&[0, 1]), None);
    }
}
