//! `query_data` on PostgreSQL: the caller's one statement, run as the query role
//! inside `run_query`, in a read-only transaction that is always rolled back.

use std::time::Duration;

use deadpool_postgres::Object;
use loadout::ToolError;
use loadout::engine::scratchpad::{self as checks, QueryResult, quoted};
use tokio_postgres::{Statement, Transaction};

use super::cells::{cell_to_json, native_type};
use super::refused::refused_statement;
use super::role::{QUERY_SCHEMA, query_role, quote_ident};
use super::{pg_error, schema_name, set_search_path};
use crate::PostgresStore;

/// Memory for each sort or hash of a `query_data` statement before it spills to disk.
const QUERY_WORK_MEM: &str = "16MB";

pub async fn query_data(
    store: &PostgresStore,
    namespace: &str,
    sql: String,
    limit: usize,
    timeout: Duration,
) -> Result<QueryResult, ToolError> {
    checks::check_query(&sql)?;
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
    enter_query_role(&tx, role, schema, timeout).await?;
    // The extended protocol: the server refuses a second statement in the text.
    // Parsed (never run) as the query role, to learn the result's columns.
    let stmt = tx.prepare(sql).await?;
    if stmt.columns().is_empty() {
        return Err(QueryFailure::NoRows);
    }
    let result = read_rows(&tx, &stmt, sql, limit).await?;
    tx.rollback().await?;
    Ok(result)
}

/// Sets the transaction up for caller SQL: its bounds, the namespace's schema, the
/// query role's grants, then read-only and the role itself.
async fn enter_query_role(
    tx: &Transaction<'_>,
    role: &str,
    schema: &str,
    timeout: Duration,
) -> Result<(), tokio_postgres::Error> {
    // First, so that waiting for another query's grants (below) is bounded too.
    // work_mem bounds each sort and hash of the query in the server's memory (past
    // it they spill to disk), for every query of every session alike.
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {}; SET LOCAL work_mem = '{QUERY_WORK_MEM}'",
        timeout.as_millis().max(1)
    ))
    .await?;
    set_search_path(tx, schema).await?;
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
    tx.batch_execute(&enter).await
}

/// Runs `sql`, parsed as `stmt`, inside `run_query` and reads at most `limit` rows
/// (one more, to tell whether there were more).
async fn read_rows(
    tx: &Transaction<'_>,
    stmt: &Statement,
    sql: &str,
    limit: usize,
) -> Result<QueryResult, tokio_postgres::Error> {
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
    Ok(QueryResult {
        columns,
        n_rows: rows.len(),
        rows,
        truncated,
        limit,
    })
}

fn query_error(store: &PostgresStore, e: tokio_postgres::Error, timeout: Duration) -> ToolError {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let message = crate::describe_pg_error(&e);
        return match code {
            // read_only_sql_transaction
            "25006" => checks::refused_write(&message),
            // query_canceled (statement_timeout)
            "57014" => checks::timed_out(timeout),
            // syntax_error for "cannot insert multiple commands into a prepared statement"
            "42601" if message.contains("multiple commands") => {
                ToolError::execution(checks::ONE_STATEMENT)
            }
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
