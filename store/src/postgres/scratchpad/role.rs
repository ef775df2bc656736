//! The role `query_data` runs caller SQL as on PostgreSQL: set up once per store,
//! refused when it could read anything by itself.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use loadout::ToolError;

use super::{fnv1a, literal, pg_error};
use crate::{PostgresStore, StoreError};

/// The schema of `run_query`. No namespace maps to it: theirs start with
/// `scratchpad_` or `scratchpadh_`.
pub(super) const QUERY_SCHEMA: &str = "loadout_scratchpad";

/// Query roles already set up by this process, by store URL (password masked).
static QUERY_ROLES: LazyLock<Mutex<HashMap<String, String>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The NOLOGIN role `query_data` runs as, set up on first use: it owns
/// `run_query` and nothing else, and is granted read access to one namespace's
/// schema only inside the query's own transaction. Creating it needs CREATEROLE
/// once; an administrator may create it instead (see [`missing_role_error`]).
pub(super) async fn query_role(store: &PostgresStore) -> Result<String, ToolError> {
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
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
