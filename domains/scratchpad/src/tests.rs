//! Calls each tool through the registry, as a server would, on every backend
//! [`loadout_store::testing::test_stores`] yields (SQLite always, PostgreSQL when
//! `LOADOUT_TEST_POSTGRES_URL` is set).

use std::sync::Arc;
use std::time::{Duration, Instant};

use loadout::{Registry, Settings, ToolContext, ToolError};
use loadout_store::StoreBackend;
use loadout_store::testing::{TestStore, test_stores};
use serde_json::{Value, json};

struct Harness {
    /// The backend's name, for failure messages.
    name: &'static str,
    registry: Arc<Registry>,
    ctx: ToolContext,
    store: TestStore,
}

/// One harness per backend, each on fresh data.
async fn harnesses() -> (tempfile::TempDir, Vec<Harness>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let registry = Arc::new(Registry::from_inventory().expect("registry"));
    let harnesses = test_stores(dir.path())
        .await
        .into_iter()
        .map(|t| Harness {
            name: t.name,
            registry: registry.clone(),
            ctx: ToolContext::new(registry.clone(), Settings::new(t.store.clone())),
            store: t,
        })
        .collect();
    (dir, harnesses)
}

impl Harness {
    async fn call(&self, tool: &str, args: Value) -> Result<Value, ToolError> {
        self.registry.call(tool, args, self.ctx.clone()).await
    }

    async fn ok(&self, tool: &str, args: Value) -> Value {
        match self.call(tool, args).await {
            Ok(value) => value,
            Err(e) => panic!("{}: {tool} failed: {e}", self.name),
        }
    }

    async fn err(&self, tool: &str, args: Value) -> String {
        match self.call(tool, args).await {
            Ok(value) => panic!("{}: {tool} should fail, returned {value}", self.name),
            Err(e) => e.to_string(),
        }
    }

    /// A BOOLEAN cell as `query_data` returns it: 0/1 on SQLite (which stores
    /// booleans as integers), true/false on PostgreSQL.
    fn boolean(&self, value: bool) -> Value {
        if self.store.is_postgres() {
            json!(value)
        } else {
            json!(i64::from(value))
        }
    }

    /// A `people` table with three rows.
    async fn with_people(&self) {
        self.ok(
            "create_table",
            json!({"table": "people", "columns": [
                {"name": "id", "type": "INTEGER", "primary_key": true},
                {"name": "name", "type": "TEXT", "not_null": true},
                {"name": "height", "type": "REAL"},
                {"name": "active", "type": "BOOLEAN"},
                {"name": "born", "type": "DATE"}
            ]}),
        )
        .await;
        self.ok(
            "insert_data",
            json!({"table": "people", "rows": [
                {"name": "Ana", "height": 1.62, "active": true, "born": "1990-04-01"},
                {"name": "Bo", "height": 1.80, "active": false},
                {"name": "지민", "height": 1.70, "active": true, "born": "2001-12-31"}
            ]}),
        )
        .await;
    }

    async fn n_people(&self) -> i64 {
        let result = self
            .ok("query_data", json!({"sql": "SELECT count(*) FROM people"}))
            .await;
        result["rows"][0][0].as_i64().expect("count")
    }
}

#[tokio::test]
async fn create_insert_query_describe_drop() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        h.with_people().await;

        let result = h
            .ok(
                "query_data",
                json!({"sql": "SELECT name, active FROM people WHERE height > 1.65 ORDER BY name"}),
            )
            .await;
        assert_eq!(result["columns"], json!(["name", "active"]));
        assert_eq!(
            result["rows"],
            json!([["Bo", h.boolean(false)], ["지민", h.boolean(true)]])
        );
        assert_eq!(result["truncated"], false);

        let tables = h.ok("list_tables", json!({})).await;
        assert_eq!(tables[0]["table"], "people");
        assert_eq!(tables[0]["n_rows"], 3);

        let described = h.ok("describe_table", json!({"table": "people"})).await;
        assert_eq!(described["columns"][3]["type"], "BOOLEAN");
        assert_eq!(described["columns"][0]["primary_key"], true);
        assert_eq!(described["columns"][1]["not_null"], true);

        let dropped = h.ok("drop_table", json!({"table": "people"})).await;
        assert_eq!(dropped["n_rows_deleted"], 3);
        assert_eq!(h.ok("list_tables", json!({})).await, json!([]));
        let message = h.err("drop_table", json!({"table": "people"})).await;
        assert!(message.contains("no table `people`"), "{message}");
    }
    drop(dir);
}

#[tokio::test]
async fn inserts_are_typed_checked_and_atomic() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        h.with_people().await;

        // A bad date in the second row: nothing of the call is kept.
        let message = h
            .err(
                "insert_data",
                json!({"table": "people", "rows": [
                    {"name": "Cy"},
                    {"name": "Di", "born": "31/12/2001"}
                ]}),
            )
            .await;
        assert!(message.contains("row 1"), "{message}");
        assert!(message.contains("CHECK constraint failed"), "{message}");
        assert_eq!(h.n_people().await, 3);

        let message = h
            .err(
                "insert_data",
                json!({"table": "people", "rows": [{"name": "Eve", "active": 2}]}),
            )
            .await;
        assert!(message.contains("CHECK constraint failed"), "{message}");

        let message = h
            .err(
                "insert_data",
                json!({"table": "people", "rows": [{"nickname": "x"}]}),
            )
            .await;
        assert!(message.contains("has no column `nickname`"), "{message}");

        let message = h
            .err(
                "insert_data",
                json!({"table": "people", "rows": [{"height": 1.5}]}),
            )
            .await;
        assert!(message.contains("NOT NULL"), "{message}");

        // Values that look like SQL are stored as text, never run.
        h.ok(
            "insert_data",
            json!({"table": "people", "rows": [{"name": "x'); DROP TABLE people; --"}]}),
        )
        .await;
        assert_eq!(h.n_people().await, 4);

        let message = h
            .err("insert_data", json!({"table": "nope", "rows": [{"a": 1}]}))
            .await;
        assert!(message.contains("no table `nope`"), "{message}");
    }
    drop(dir);
}

#[tokio::test]
async fn identifiers_are_validated() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        for table in [
            "x\"; DROP TABLE y; --",
            "1abc",
            "",
            "a b",
            "sqlite_master",
            &"a".repeat(64),
        ] {
            let message = h
                .err(
                    "create_table",
                    json!({"table": table, "columns": [{"name": "a", "type": "TEXT"}]}),
                )
                .await;
            assert!(message.contains("invalid table name"), "{table}: {message}");
        }
        let message = h
            .err(
                "create_table",
                json!({"table": "t", "columns": [{"name": "a-b", "type": "TEXT"}]}),
            )
            .await;
        assert!(message.contains("invalid column name"), "{message}");

        let error = h
            .call(
                "create_table",
                json!({"table": "t", "columns": [{"name": "a", "type": "BLOB"}]}),
            )
            .await
            .expect_err("type outside the fixed set");
        assert!(matches!(error, ToolError::InvalidArgs { .. }), "{error:?}");

        h.ok(
            "create_table",
            json!({"table": "_T1", "columns": [{"name": "a", "type": "TEXT"}]}),
        )
        .await;
        let message = h
            .err(
                "create_table",
                json!({"table": "_t1", "columns": [{"name": "a", "type": "TEXT"}]}),
            )
            .await;
        assert!(message.contains("already exists"), "{message}");
        let again = h
            .ok(
                "create_table",
                json!({"table": "_T1", "columns": [{"name": "a", "type": "TEXT"}], "if_not_exists": true}),
            )
            .await;
        assert_eq!(again["created"], false);
    }
    drop(dir);
}

#[tokio::test]
async fn query_data_is_read_only() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        h.with_people().await;
        let outside = h.store.data_dir.join("outside.db");
        let attach = format!("ATTACH DATABASE '{}' AS other", outside.display());
        let vacuum = format!("VACUUM INTO '{}'", outside.display());
        // Valid SQL on both engines, then each engine's own ways to write.
        let mut writes = vec![
            "INSERT INTO people(name) VALUES ('Mallory')",
            "UPDATE people SET name = 'Mallory'",
            "DELETE FROM people",
            "DROP TABLE people",
            "CREATE TABLE evil(x TEXT)",
            "CREATE TEMP TABLE evil(x TEXT)",
            "ALTER TABLE people ADD COLUMN evil TEXT",
            "WITH x AS (SELECT 1) DELETE FROM people",
            "SELECT 1; DROP TABLE people",
            "SELECT 1; SELECT 2",
        ];
        if h.store.is_postgres() {
            writes.extend([
                "TRUNCATE people",
                "SELECT * FROM people FOR UPDATE",
                "SELECT nextval('people_id_seq')",
                "EXPLAIN ANALYZE DELETE FROM people",
                "DO $$ BEGIN DELETE FROM people; END $$",
                "CREATE SCHEMA evil",
                "SELECT 1; COMMIT; DELETE FROM people",
            ]);
        } else {
            writes.extend([
                "CREATE TABLE evil(x)",
                "PRAGMA user_version = 7",
                "REPLACE INTO people(id, name) VALUES (1, 'Mallory')",
                attach.as_str(),
                vacuum.as_str(),
            ]);
        }
        for sql in writes {
            let message = h.err("query_data", json!({"sql": sql})).await;
            assert!(
                message.contains("read-only")
                    || message.contains("exactly one statement")
                    || message.contains("cannot attach"),
                "{}: {sql}: {message}",
                h.name
            );
        }
        assert!(
            !outside.exists(),
            "no file may be created through query_data"
        );
        assert_eq!(h.n_people().await, 3);
        let names = h
            .ok(
                "query_data",
                json!({"sql": "SELECT name FROM people ORDER BY id"}),
            )
            .await;
        assert_eq!(names["rows"], json!([["Ana"], ["Bo"], ["지민"]]));
        if !h.store.is_postgres() {
            let version = h
                .ok("query_data", json!({"sql": "PRAGMA user_version"}))
                .await;
            assert_eq!(version["rows"], json!([[0]]));
        }
        // A trailing `;` or comment is still one statement.
        h.ok("query_data", json!({"sql": "SELECT 1; -- done"}))
            .await;
    }
    drop(dir);
}

/// N1 of issue 36: a PRAGMA run through query_data changed process-wide limits
/// (SQLite only lets `hard_heap_limit` go down), after which every storage call of
/// the process failed with "out of memory" until restart.
#[tokio::test]
async fn query_data_cannot_change_the_process_or_reach_other_files() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        if h.store.is_postgres() {
            continue;
        }
        h.with_people().await;
        let other = h.store.data_dir.join("loadout.db");
        let attach = format!("ATTACH DATABASE '{}' AS other", other.display());
        for sql in [
            "PRAGMA hard_heap_limit=100000",
            "PRAGMA soft_heap_limit=1",
            "PRAGMA temp_store_directory='/tmp'",
            "PRAGMA query_only=0",
            "PRAGMA writable_schema=1",
            "PRAGMA cache_size=100000000",
            "SELECT load_extension('x')",
            "BEGIN",
            "DETACH DATABASE main",
            attach.as_str(),
        ] {
            let message = h.err("query_data", json!({"sql": sql})).await;
            assert!(
                message.contains("is refused") || message.contains("no such"),
                "{sql}: {message}"
            );
        }
        let message = h
            .err(
                "query_data",
                json!({"sql": "PRAGMA hard_heap_limit=100000"}),
            )
            .await;
        assert!(
            message.contains("PRAGMA hard_heap_limit is refused"),
            "{message}"
        );
        // The process's limits are as loadout set them.
        let probe = rusqlite::Connection::open_in_memory().expect("in-memory database");
        for (pragma, refused) in [("hard_heap_limit", 100_000), ("soft_heap_limit", 1)] {
            let value: i64 = probe
                .query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))
                .expect(pragma);
            assert_ne!(value, refused, "{pragma}");
        }
        // Storage still works: a write, a setting, and the schema pragmas that only
        // describe the session's own tables.
        h.ok(
            "insert_data",
            json!({"table": "people", "rows": [{"name": "Dee"}]}),
        )
        .await;
        assert_eq!(h.n_people().await, 4);
        h.ctx
            .settings()
            .set("scratchpad_probe", "1")
            .await
            .expect("a setting is stored after the refusals");
        let info = h
            .ok("query_data", json!({"sql": "PRAGMA table_info(people)"}))
            .await;
        assert!(info["n_rows"].as_u64().unwrap_or(0) >= 2, "{info}");
    }
    drop(dir);
}

#[tokio::test]
async fn row_limit_and_truncation() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        h.ok(
            "create_table",
            json!({"table": "n", "columns": [{"name": "i", "type": "INTEGER"}]}),
        )
        .await;
        let rows: Vec<Value> = (0..1000).map(|i| json!({"i": i})).collect();
        h.ok("insert_data", json!({"table": "n", "rows": rows}))
            .await;
        h.ok("insert_data", json!({"table": "n", "rows": rows}))
            .await;

        let default = h.ok("query_data", json!({"sql": "SELECT i FROM n"})).await;
        assert_eq!(default["n_rows"], 100);
        assert_eq!(default["truncated"], true);

        let small = h
            .ok("query_data", json!({"sql": "SELECT i FROM n", "limit": 5}))
            .await;
        assert_eq!(small["rows"], json!([[0], [1], [2], [3], [4]]));
        assert_eq!(small["truncated"], true);

        let capped = h
            .ok(
                "query_data",
                json!({"sql": "SELECT i FROM n", "limit": 50000}),
            )
            .await;
        assert_eq!(capped["n_rows"], 1000);
        assert_eq!(capped["limit"], 1000);
        assert_eq!(capped["truncated"], true);

        let exact = h
            .ok(
                "query_data",
                json!({"sql": "SELECT i FROM n WHERE i < 3", "limit": 6}),
            )
            .await;
        assert_eq!(exact["n_rows"], 6);
        assert_eq!(exact["truncated"], false);

        let too_many: Vec<Value> = (0..1001).map(|i| json!({"i": i})).collect();
        let message = h
            .err("insert_data", json!({"table": "n", "rows": too_many}))
            .await;
        assert!(message.contains("at most 1000"), "{message}");
    }
    drop(dir);
}

#[tokio::test]
async fn runaway_queries_are_interrupted() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        let sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
        let started = Instant::now();
        let timeout = Duration::from_millis(200);
        let error = match h.store.store.backend() {
            StoreBackend::Sqlite(_) => {
                let path = h.store.data_dir.join("scratchpad").join("timeout.db");
                loadout_store::sqlite::scratchpad::query_data(path, sql.into(), 10, timeout).await
            }
            StoreBackend::Postgres(store) => {
                loadout_store::postgres::scratchpad::query_data(
                    store,
                    "timeout",
                    sql.into(),
                    10,
                    timeout,
                )
                .await
            }
            _ => panic!("a backend without a scratchpad"),
        }
        .expect_err("interrupted");
        assert!(error.to_string().contains("was stopped"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    drop(dir);
}

/// Issue 31, defect 4: one `replace(hex(zeroblob(…)))` took 1.9 GB of the server's
/// memory and ran 30 s past the 5 s limit, in one step the interrupt never reached.
/// Now no value may outgrow a bound, so it stops at once with the reason.
#[tokio::test]
async fn a_query_that_builds_a_huge_value_stops_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("scratchpad").join("huge.db");
    let started = Instant::now();
    let sql = "SELECT length(replace(hex(zeroblob(100000000)),'00','abcdefgh'))";
    let error = loadout_store::sqlite::scratchpad::query_data(
        path.clone(),
        sql.into(),
        10,
        Duration::from_secs(5),
    )
    .await
    .expect_err("refused");
    assert!(error.to_string().contains("larger than"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Within the bound, the same shape of query still answers.
    let sql = "SELECT length(replace(hex(zeroblob(1000)),'00','ab'))";
    let answer =
        loadout_store::sqlite::scratchpad::query_data(path, sql.into(), 10, Duration::from_secs(5))
            .await
            .expect("a small value");
    assert_eq!(answer.rows, vec![vec![json!(2000)]]);
}

#[tokio::test]
async fn each_session_has_its_own_database() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        let alice = h.ctx.clone().with_session("alice");
        let bob = h.ctx.clone().with_session("bob");
        h.registry
            .call(
                "create_table",
                json!({"table": "notes", "columns": [{"name": "t", "type": "TEXT"}]}),
                alice.clone(),
            )
            .await
            .expect("create");
        let alice_tables = h
            .registry
            .call("list_tables", json!({}), alice)
            .await
            .expect("list");
        let bob_tables = h
            .registry
            .call("list_tables", json!({}), bob)
            .await
            .expect("list");
        assert_eq!(alice_tables.as_array().map(Vec::len), Some(1));
        assert_eq!(bob_tables, json!([]));
        if !h.store.is_postgres() {
            assert!(h.store.data_dir.join("scratchpad/alice.db").exists());
        }

        let sneaky = h.ctx.clone().with_session("../evil");
        let error = h
            .registry
            .call("list_tables", json!({}), sneaky)
            .await
            .expect_err("bad namespace");
        assert!(error.to_string().contains("namespace"), "{error}");
    }
    drop(dir);
}

/// A value no error message or result may ever contain: it lives only in loadout's
/// own settings table.
const CANARY: &str = "sk-canary-7f3a9c";

impl Harness {
    async fn call_as(&self, session: &str, tool: &str, args: Value) -> Result<Value, ToolError> {
        let ctx = self.ctx.clone().with_session(session);
        self.registry.call(tool, args, ctx).await
    }

    /// `query_data` in `session` must fail; returns the message, which must not
    /// leak the canary.
    async fn query_refused(&self, session: &str, sql: &str) -> String {
        match self
            .call_as(session, "query_data", json!({ "sql": sql }))
            .await
        {
            Ok(value) => panic!("{}: `{sql}` should be refused, returned {value}", self.name),
            Err(e) => {
                let message = e.to_string();
                assert!(!message.contains(CANARY), "{}: {sql}: {message}", self.name);
                message
            }
        }
    }
}

/// `query_data` reads the session's own tables and nothing else: not loadout's
/// tables (settings, audit log, sessions), not another session's tables, whatever
/// the SQL tries (qualified names, attaching files, changing role).
#[tokio::test]
async fn query_data_reads_only_the_sessions_own_tables() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        h.store
            .store
            .setting_set("llm_api_key", CANARY)
            .await
            .expect("set");
        for (session, table, value) in [("alice", "notes", "alice's"), ("bob", "secrets", "bob's")]
        {
            h.call_as(
                session,
                "create_table",
                json!({"table": table, "columns": [{"name": "t", "type": "TEXT"}]}),
            )
            .await
            .expect("create");
            h.call_as(
                session,
                "insert_data",
                json!({"table": table, "rows": [{"t": value}]}),
            )
            .await
            .expect("insert");
        }
        let own = h
            .call_as("alice", "query_data", json!({"sql": "SELECT t FROM notes"}))
            .await
            .expect("own table");
        assert_eq!(own["rows"], json!([["alice's"]]), "{}", h.name);

        if h.store.is_postgres() {
            for table in [
                "settings",
                "audit_log",
                "sessions",
                "messages",
                "schema_version",
            ] {
                let message = h
                    .query_refused("alice", &format!("SELECT * FROM public.{table}"))
                    .await;
                assert!(
                    message.contains("reads only this session's scratchpad tables")
                        && message.contains(&format!("permission denied for table {table}")),
                    "{table}: {message}"
                );
            }
            // Unqualified names resolve in the session's schema only.
            let message = h.query_refused("alice", "SELECT * FROM settings").await;
            assert!(message.contains("does not exist"), "{message}");
            for sql in [
                "SELECT * FROM scratchpad_bob.secrets",
                "SELECT * FROM \"scratchpad_bob\".secrets",
            ] {
                let message = h.query_refused("alice", sql).await;
                assert!(
                    message.contains("permission denied for schema scratchpad_bob"),
                    "{sql}: {message}"
                );
            }
            // Ways back to the role loadout logged in as, then a read at run time.
            let message = h
                .query_refused(
                    "alice",
                    "SELECT set_config('role', 'none', true) AS r, \
                     query_to_xml('SELECT * FROM public.settings', true, false, '')::text AS x",
                )
                .await;
            // Refused before it runs (issue 36), as every way back to that role is.
            assert!(message.contains("set_config() is refused"), "{message}");
            let message = h
                .query_refused(
                    "alice",
                    "SELECT query_to_xml('SELECT * FROM public.settings', true, false, '')::text",
                )
                .await;
            assert!(message.contains("query_to_xml() is refused"), "{message}");
            for (sql, refused) in [
                ("RESET ROLE", "RESET is refused"),
                ("SET ROLE NONE", "SET is refused"),
                (
                    "DO $$ BEGIN PERFORM set_config('role', 'none', true); \
                     RAISE EXCEPTION '%', (SELECT string_agg(value, ',') FROM public.settings); END $$",
                    "DO is refused",
                ),
            ] {
                let message = h.query_refused("alice", sql).await;
                assert!(message.contains(refused), "{sql}: {message}");
            }
            let message = h
                .query_refused(
                    "alice",
                    "SELECT set_config('transaction_read_only', 'off', true)",
                )
                .await;
            assert!(message.contains("set_config() is refused"), "{message}");
            let StoreBackend::Postgres(pg) = h.store.store.backend() else {
                unreachable!("a PostgreSQL test store");
            };
            // The grants lived only inside each query's transaction.
            let client = pg.client().await.expect("client");
            let row = client
                .query_one(
                    "SELECT current_user::text || '_loadout_query',
                            has_schema_privilege(current_user::text || '_loadout_query', 'scratchpad_alice', 'USAGE'),
                            has_table_privilege(current_user::text || '_loadout_query', 'scratchpad_alice.notes', 'SELECT')",
                    &[],
                )
                .await
                .expect("privileges");
            let role: String = row.get(0);
            assert!(!row.get::<_, bool>(1), "{role} kept USAGE on the schema");
            assert!(!row.get::<_, bool>(2), "{role} kept SELECT on the table");
            // Columns declared with type modifiers, then a type read as text (which
            // casts every column to text), pass through the function that confines
            // the query role.
            for (sql, expected) in [
                (
                    "SELECT 'ab'::varchar(3) AS v, 2.5::numeric(5,2) AS n, 'x'::char(2) AS c, \
                     DATE '2001-12-31' AS d",
                    json!([["ab", 2.5, "x ", "2001-12-31"]]),
                ),
                (
                    "SELECT 'ab'::varchar(3) AS v, 2.5::numeric(5,2) AS n, ROW(1, 'a') AS r",
                    json!([["ab", "2.50", "(1,a)"]]),
                ),
            ] {
                let typed = h
                    .call_as("alice", "query_data", json!({"sql": sql}))
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                assert_eq!(typed["rows"], expected, "{sql}");
            }
            // Queries of two sessions at once each see their own table.
            let (a, b) = tokio::join!(
                h.call_as("alice", "query_data", json!({"sql": "SELECT t FROM notes"})),
                h.call_as("bob", "query_data", json!({"sql": "SELECT t FROM secrets"})),
            );
            assert_eq!(a.expect("alice")["rows"], json!([["alice's"]]));
            assert_eq!(b.expect("bob")["rows"], json!([["bob's"]]));
        } else {
            let scratch = h.store.data_dir.join("scratchpad");
            for file in [h.store.data_dir.join("loadout.db"), scratch.join("bob.db")] {
                assert!(file.exists(), "{}", file.display());
                let sql = format!("ATTACH DATABASE '{}' AS other", file.display());
                let message = h.query_refused("alice", &sql).await;
                assert!(message.contains("cannot attach"), "{sql}: {message}");
            }
            let message = h
                .query_refused("alice", "SELECT * FROM other.settings")
                .await;
            assert!(message.contains("no such table"), "{message}");
            let message = h.query_refused("alice", "SELECT * FROM settings").await;
            assert!(message.contains("no such table"), "{message}");
            let message = h.query_refused("alice", "SELECT * FROM secrets").await;
            assert!(message.contains("no such table"), "{message}");
        }
    }
    drop(dir);
}

/// A grant an operator made to PUBLIC on a table in the database would let caller
/// SQL read it: query_data refuses to run at all, naming the table.
#[tokio::test]
async fn query_data_refuses_a_query_role_that_can_read_other_tables() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        let StoreBackend::Postgres(pg) = h.store.store.backend() else {
            continue;
        };
        let client = pg.client().await.expect("client");
        client
            .batch_execute("GRANT SELECT ON public.audit_log TO PUBLIC")
            .await
            .expect("grant");
        let message = h.query_refused("alice", "SELECT 1").await;
        assert!(
            message.contains("query_data is disabled") && message.contains("public.audit_log"),
            "{message}"
        );
    }
    drop(dir);
}

/// Without CREATEROLE, and with no query role made by an administrator, query_data
/// says what to run instead of failing obscurely; nothing else is affected.
#[tokio::test]
async fn query_data_without_createrole_is_a_clear_error() {
    let Some(admin_url) = loadout_store::testing::postgres_url() else {
        eprintln!(
            "note: {} unset; PostgreSQL CREATEROLE test skipped",
            loadout_store::testing::POSTGRES_URL_VAR
        );
        return;
    };
    let pid = std::process::id();
    let user = format!("loadout_t_nocr_{pid}");
    let database = format!("loadout_t_{pid}_nocr");
    let admin = connect(&admin_url).await;
    drop_stale_nocr_roles(&admin).await;
    // One statement per call: DROP/CREATE DATABASE refuse to run in the implicit
    // transaction of a multi-statement query.
    for sql in [
        format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"),
        format!("DROP ROLE IF EXISTS \"{user}\""),
        format!("CREATE ROLE \"{user}\" LOGIN PASSWORD 'nocr' NOCREATEROLE"),
        format!("GRANT \"{user}\" TO CURRENT_USER"),
        format!(
            "CREATE DATABASE \"{database}\" OWNER \"{user}\" TEMPLATE template0 ENCODING 'UTF8'"
        ),
    ] {
        admin
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let url = with_user_and_database(&admin_url, &user, "nocr", &database)
        .expect("a postgres://user:password@host/database URL");
    let dir = tempfile::tempdir().expect("tempdir");
    let result = async {
        let store = loadout_store::Store::connect(Some(&url), dir.path())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let registry = Arc::new(Registry::from_inventory().expect("registry"));
        let ctx =
            ToolContext::new(registry.clone(), Settings::new(store.clone())).with_session("alice");
        registry
            .call(
                "create_table",
                json!({"table": "t", "columns": [{"name": "a", "type": "TEXT"}]}),
                ctx.clone(),
            )
            .await
            .map_err(|e| format!("create_table: {e}"))?;
        let error = registry
            .call("query_data", json!({"sql": "SELECT * FROM t"}), ctx.clone())
            .await
            .err()
            .ok_or("query_data ran without a query role")?;
        let listed = registry
            .call("list_tables", json!({}), ctx)
            .await
            .map_err(|e| format!("list_tables: {e}"))?;
        Ok::<_, String>((error.to_string(), listed))
    }
    .await;
    for sql in [
        format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"),
        format!("DROP ROLE IF EXISTS \"{user}\""),
    ] {
        let _ = admin.batch_execute(&sql).await;
    }
    let (message, listed) = result.expect("the store works without CREATEROLE");
    assert!(
        message.contains("lacks CREATEROLE")
            && message.contains(&format!("ALTER ROLE \"{user}\" CREATEROLE"))
            && message.contains(&format!("CREATE ROLE \"{user}_loadout_query\" NOLOGIN")),
        "{message}"
    );
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    drop(dir);
}

async fn connect(url: &str) -> loadout_store::tokio_postgres::Client {
    let (client, connection) =
        loadout_store::tokio_postgres::connect(url, loadout_store::tokio_postgres::NoTls)
            .await
            .expect("connect to the test server");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Roles of this test left behind by killed runs (their process is gone).
async fn drop_stale_nocr_roles(admin: &loadout_store::tokio_postgres::Client) {
    let Ok(rows) = admin
        .query(
            "SELECT rolname::text FROM pg_roles WHERE starts_with(rolname, 'loadout_t_nocr_')",
            &[],
        )
        .await
    else {
        return;
    };
    for row in rows {
        let name: String = row.get(0);
        let alive = name
            .trim_start_matches("loadout_t_nocr_")
            .parse::<u32>()
            .is_ok_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = admin
                .batch_execute(&format!("DROP ROLE IF EXISTS \"{name}\""))
                .await;
        }
    }
}

/// `postgres://USER:PASSWORD@HOST/DATABASE?QUERY` from the test server's URL.
fn with_user_and_database(url: &str, user: &str, password: &str, database: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let authority = rest
        .split_once('/')
        .map_or(rest, |(authority, _)| authority);
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let mut out = format!("{scheme}://{user}:{password}@{host}/{database}");
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    Some(out)
}
