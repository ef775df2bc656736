//! Every test body runs against each backend [`testing::test_stores`] yields:
//! SQLite always, PostgreSQL when `LOADOUT_TEST_POSTGRES_URL` is set.

use std::time::{Duration, Instant};

use super::testing::{self, TestStore};
use super::*;
use loadout::Settings;

async fn stores() -> (tempfile::TempDir, Vec<TestStore>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let stores = testing::test_stores(dir.path()).await;
    (dir, stores)
}

/// Writes a row into `schema_version` behind the store's back.
async fn bump_schema_version(t: &TestStore, version: i64) {
    match t.store.backend() {
        StoreBackend::Sqlite(s) => s
            .call(move |c| {
                c.execute(
                    "INSERT INTO schema_version(version, applied_ms) VALUES (?1, 0)",
                    [version],
                )?;
                Ok(())
            })
            .await
            .expect("bump"),
        StoreBackend::Postgres(s) => {
            let client = s.client().await.expect("client");
            client
                .execute(
                    "INSERT INTO schema_version(version, applied_ms) VALUES ($1, 0)",
                    &[&version],
                )
                .await
                .expect("bump");
        }
    }
}

async fn schema_versions(t: &TestStore) -> Vec<i64> {
    match t.store.backend() {
        StoreBackend::Sqlite(s) => s
            .call(|c| {
                let mut stmt = c.prepare("SELECT version FROM schema_version ORDER BY version")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                Ok(rows.collect::<Result<Vec<i64>, _>>()?)
            })
            .await
            .expect("versions"),
        StoreBackend::Postgres(s) => {
            let client = s.client().await.expect("client");
            client
                .query("SELECT version FROM schema_version ORDER BY version", &[])
                .await
                .expect("versions")
                .iter()
                .map(|r| r.get(0))
                .collect()
        }
    }
}

#[tokio::test]
async fn settings_roundtrip_and_unset() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        store.setting_set("weather_key", "abc").await.expect("set");
        store.setting_set("weather_key", "abcd").await.expect("set");
        assert_eq!(
            store.settings_all().await.expect("all")["weather_key"],
            "abcd",
            "{}",
            t.name
        );
        assert!(store.setting_unset("weather_key").await.expect("unset"));
        assert!(
            !store
                .setting_unset("weather_key")
                .await
                .expect("unset again"),
            "{}",
            t.name
        );
        assert!(store.setting_set("Bad Key", "x").await.is_err());
    }
}

/// Every version from the first to the newest: what a fresh database records.
fn all_versions() -> Vec<i64> {
    (1..=SCHEMA_VERSION).collect()
}

#[tokio::test]
async fn settings_version_ignores_other_writes() {
    // Only a settings write may move the version: anything else (the decision log
    // above all, written all the time on its own connection) would make every
    // settings recheck reload the table.
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        store.setting_set("a", "1").await.expect("set");
        let before = store.settings_version().await.expect("version");
        store
            .decisions_insert(vec![DecisionRow {
                at_ms: 1,
                session: None,
                turn: 1,
                message: "hello".into(),
                n_tools: 0,
                tokens: 0,
                reasons: Reasons::default(),
            }])
            .await
            .expect("log");
        store
            .message_append("s-1", "user", &serde_json::json!("hi"))
            .await
            .expect("append");
        let other = t.reopen().await.expect("reopen");
        other
            .message_append("s-1", "user", &serde_json::json!("again"))
            .await
            .expect("append");
        assert_eq!(
            store.settings_version().await.expect("version"),
            before,
            "{}",
            t.name
        );
    }
}

#[tokio::test]
async fn settings_version_changes_with_every_write() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        let v0 = store.settings_version().await.expect("version");
        store.setting_set("a", "1").await.expect("set");
        let v1 = store.settings_version().await.expect("version");
        assert_ne!(v0, v1, "{}", t.name);
        // A write through another handle (another process or replica).
        let other = t.reopen().await.expect("reopen");
        other.setting_set("a", "2").await.expect("set");
        let v2 = store.settings_version().await.expect("version");
        assert_ne!(v1, v2, "{}", t.name);
        other.setting_unset("a").await.expect("unset");
        assert_ne!(
            v2,
            store.settings_version().await.expect("version"),
            "{}",
            t.name
        );
    }
}

#[tokio::test]
async fn turns_count_user_messages_and_survive_reopen() {
    let (_dir, stores) = stores().await;
    for t in stores {
        {
            let store = t.reopen().await.expect("open");
            let id = "s1";
            let append = |role: &'static str, text: &'static str| {
                let store = store.clone();
                async move {
                    store
                        .message_append(id, role, &serde_json::json!(text))
                        .await
                        .expect("append")
                }
            };
            assert_eq!(append("user", "hi").await, 1, "{}", t.name);
            assert_eq!(append("assistant", "hello").await, 1, "{}", t.name);
            assert_eq!(append("user", "more").await, 2, "{}", t.name);
        }
        let store = t.reopen().await.expect("reopen");
        assert_eq!(
            store.session_turn("s1").await.expect("turn"),
            2,
            "{}",
            t.name
        );
        let messages = store.messages("s1").await.expect("messages");
        assert_eq!(
            messages
                .iter()
                .map(|m| (m.turn, m.role.as_str(), m.content.clone()))
                .collect::<Vec<_>>(),
            [
                (1, "user", serde_json::json!("hi")),
                (1, "assistant", serde_json::json!("hello")),
                (2, "user", serde_json::json!("more")),
            ],
            "{}",
            t.name
        );
        assert!(store.session_exists("s1").await.expect("exists"));
        assert!(!store.session_exists("s2").await.expect("exists"));
        assert_eq!(store.session_turn("s2").await.expect("turn"), 0);
        assert!(
            store
                .message_append("../x", "user", &serde_json::json!("x"))
                .await
                .is_err()
        );
    }
}

#[tokio::test]
async fn a_snapshot_names_the_tools_called_in_the_latest_turn() {
    use serde_json::json;
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        let id = "calls";
        let append = |role: &'static str, content: serde_json::Value| async move {
            store
                .message_append(id, role, &content)
                .await
                .expect("append")
        };
        let calls = || async {
            store
                .session_snapshot(id)
                .await
                .expect("snapshot")
                .recent_calls
        };
        assert!(calls().await.is_empty(), "{}", t.name);
        append("user", json!("find my notes on flights")).await;
        append(
            "tool",
            json!({"name": "recall", "ok": true, "content": "[]"}),
        )
        .await;
        // Failed or refused calls found nothing; malformed rows are skipped.
        append(
            "tool",
            json!({"name": "forget", "ok": false, "content": "error"}),
        )
        .await;
        append("tool", json!({"ok": true})).await;
        append("tool", json!("not an object")).await;
        append("assistant", json!({"content": "none", "tool_calls": []})).await;
        assert_eq!(calls().await, [(1, "recall".to_owned())], "{}", t.name);
        append("user", json!("and about trains")).await;
        assert!(calls().await.is_empty(), "{}", t.name);
        append(
            "tool",
            json!({"name": "list_memories", "ok": true, "content": "[]"}),
        )
        .await;
        assert_eq!(
            calls().await,
            [(2, "list_memories".to_owned())],
            "{}",
            t.name
        );
        // A result holding a NUL character (a file with a NUL byte) is stored as
        // it came and spoils neither the snapshot nor the history.
        append(
            "tool",
            json!({"name": "read_file", "ok": true, "content": "a\u{0}b"}),
        )
        .await;
        assert_eq!(
            calls().await,
            [(2, "list_memories".to_owned()), (2, "read_file".to_owned())],
            "{}",
            t.name
        );
        let messages = store.messages(id).await.expect("messages");
        assert_eq!(
            messages.last().map(|m| m.content["content"].clone()),
            Some(json!("a\u{0}b")),
            "{}",
            t.name
        );
    }
}

#[tokio::test]
async fn a_turn_keeps_its_carry_over_with_its_message() {
    use serde_json::json;
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        let id = "carry";
        let carry = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let head = || async {
            let snapshot = store.session_snapshot(id).await.expect("snapshot");
            (snapshot.turn, snapshot.carry)
        };
        assert_eq!(head().await, (0, vec![]), "{}", t.name);
        let turn = store
            .turn_append(
                id,
                &json!("list my containers"),
                &carry(&["list_containers"]),
            )
            .await
            .expect("turn");
        assert_eq!(turn, 1);
        assert_eq!(head().await, (1, carry(&["list_containers"])), "{}", t.name);
        // Other messages of the turn leave it alone.
        store
            .message_append(id, "assistant", &json!({"content": "three"}))
            .await
            .expect("append");
        assert_eq!(head().await, (1, carry(&["list_containers"])), "{}", t.name);
        // A re-route within the turn replaces it; a write for an older turn does not.
        store
            .session_carry_put(id, 1, &carry(&["list_containers", "restart_container"]))
            .await
            .expect("put");
        store
            .session_carry_put(id, 0, &carry(&["stale"]))
            .await
            .expect("put");
        assert_eq!(
            head().await,
            (1, carry(&["list_containers", "restart_container"])),
            "{}",
            t.name
        );
        // A user message stored without one starts a turn that carries nothing.
        store
            .message_append(id, "user", &json!("thanks"))
            .await
            .expect("append");
        assert_eq!(head().await, (2, vec![]), "{}", t.name);
        assert!(
            store.session_carry_put("../x", 2, &[]).await.is_err(),
            "{}",
            t.name
        );
    }
}

#[tokio::test]
async fn sessions_router_state_and_decisions() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        let id = store.session_create().await.expect("create");
        assert_eq!(id.len(), 32, "{}", t.name);
        assert!(store.session_exists(&id).await.expect("exists"));
        store
            .session_ensure(&id)
            .await
            .expect("ensure is idempotent");

        let state = SessionDomainState {
            domain: "weather".into(),
            last_used_turn: 3,
            pinned: true,
            unloaded: false,
        };
        store.session_domain_put(&id, &state).await.expect("put");
        let updated = SessionDomainState {
            last_used_turn: 4,
            unloaded: true,
            ..state.clone()
        };
        store.session_domain_put(&id, &updated).await.expect("put");
        assert_eq!(
            store.session_domains(&id).await.expect("domains"),
            std::slice::from_ref(&updated),
            "{}",
            t.name
        );

        store.domain_used("weather", 2_000).await.expect("used");
        store
            .domain_used("weather", 1_000)
            .await
            .expect("older use");
        store.domain_used("memory", 500).await.expect("used");
        assert_eq!(
            store.domains_used_since(1_500).await.expect("since"),
            ["weather"],
            "{}",
            t.name
        );
        let snapshot = store.session_snapshot(&id).await.expect("snapshot");
        assert_eq!(
            (snapshot.turn, snapshot.domains),
            (0, vec![updated.clone()]),
            "{}",
            t.name
        );
        assert_eq!(
            store
                .session_snapshot("new-session")
                .await
                .expect("empty")
                .turn,
            0,
            "{}",
            t.name
        );
        assert_eq!(
            store.domains_used_since(0).await.expect("since"),
            ["memory", "weather"],
            "{}",
            t.name
        );
        // Ranked by their last use, newest first, then by name; the cutoff counts.
        store.domain_used("calendar", 2_000).await.expect("used");
        store.domain_used("files", 1_500).await.expect("used");
        assert_eq!(
            store
                .domains_used_since_by_recency(1_500)
                .await
                .expect("ranked"),
            [
                ("calendar".to_owned(), 2_000),
                ("weather".to_owned(), 2_000),
                ("files".to_owned(), 1_500),
            ],
            "{}",
            t.name
        );

        let rows: Vec<DecisionRow> = (1..=3)
            .map(|turn| DecisionRow {
                at_ms: 10 * turn,
                session: Some(id.clone()),
                turn,
                message: format!("message {turn} with 'quotes' and ünïcödé"),
                n_tools: turn,
                tokens: 100 * turn,
                reasons: Reasons {
                    tools: vec!["get_forecast".into()],
                    near: [("weather".to_owned(), 0.5)].into(),
                    ..Reasons::default()
                },
            })
            .chain(std::iter::once(DecisionRow {
                at_ms: 1,
                session: None,
                turn: 0,
                message: String::new(),
                n_tools: 0,
                tokens: 0,
                reasons: Reasons::default(),
            }))
            .collect();
        store.decisions_insert(rows.clone()).await.expect("insert");
        store
            .decisions_insert(Vec::new())
            .await
            .expect("empty batch");
        // PostgreSQL text holds no NUL: the row is still written.
        let nul = DecisionRow {
            session: Some("nul".into()),
            message: "a\u{0}b".into(),
            ..rows[0].clone()
        };
        store
            .decisions_insert(vec![nul])
            .await
            .expect("NUL in a message");
        let stored = &store.decisions("nul").await.expect("decisions")[0].message;
        assert!(
            stored == "a\u{0}b" || stored == "a\u{fffd}b",
            "{}: {stored:?}",
            t.name
        );
        assert_eq!(
            store.decisions(&id).await.expect("decisions"),
            rows[..3],
            "{}",
            t.name
        );
    }
}

#[tokio::test]
async fn pruning_the_decision_log_cuts_it_at_its_old_end() {
    let (_dir, stores) = stores().await;
    let future = now_ms() + 2 * crate::FUTURE_SLACK_MS;
    for t in stores {
        let store = &t.store;
        let row = |session: &str, at_ms: i64| DecisionRow {
            at_ms,
            session: Some(session.into()),
            turn: 1,
            message: format!("at {at_ms}"),
            n_tools: 1,
            tokens: 10,
            reasons: Reasons::default(),
        };
        assert_eq!(store.decisions_prune(100, 10).await.expect("empty log"), 0);
        // Old rows, one stamped far in the future among them, then recent rows with
        // one whose clock was behind; two sessions interleaved, over two batches.
        let first: Vec<DecisionRow> = [("s", 10), ("t", 20), ("s", future), ("t", 30)]
            .into_iter()
            .map(|(s, at)| row(s, at))
            .collect();
        let second: Vec<DecisionRow> = [("s", 40), ("t", 50), ("s", 200), ("t", 60), ("s", 300)]
            .into_iter()
            .map(|(s, at)| row(s, at))
            .collect();
        for batch in [first, second] {
            store.decisions_insert(batch).await.expect("insert");
        }
        let at_of = |rows: Vec<DecisionRow>| rows.iter().map(|r| r.at_ms).collect::<Vec<_>>();
        assert_eq!(
            at_of(store.decisions("s").await.expect("s")),
            [10, future, 40, 200, 300],
            "{}",
            t.name
        );
        let pruned = [
            store.decisions_prune(100, 4).await.expect("prune"),
            store.decisions_prune(100, 4).await.expect("prune"),
            store.decisions_prune(100, 4).await.expect("prune"),
        ];
        assert_eq!(pruned, [4, 2, 0], "{}", t.name);
        assert_eq!(
            at_of(store.decisions("s").await.expect("s")),
            [200, 300],
            "{}",
            t.name
        );
        assert_eq!(
            at_of(store.decisions("t").await.expect("t")),
            [60],
            "{}",
            t.name
        );
        let first = store.first_decision("s").await.expect("first");
        assert_eq!(first.map(|r| r.at_ms), Some(200), "{}", t.name);
        let none = store.first_decision("nobody").await.expect("first");
        assert_eq!(none, None, "{}", t.name);

        // Everything old: the log empties, and a session that starts again begins a
        // new chain rather than joining the deleted one.
        assert_eq!(
            store.decisions_prune(now_ms(), 10).await.expect("prune"),
            3,
            "{}",
            t.name
        );
        store
            .decisions_insert(vec![row("t", 70)])
            .await
            .expect("insert");
        assert_eq!(
            at_of(store.decisions("t").await.expect("t")),
            [70],
            "{}",
            t.name
        );
        assert!(
            store.decisions("s").await.expect("s").is_empty(),
            "{}",
            t.name
        );
    }
}

/// Decision rows read back as they were written, by session and from the log's tail,
/// on every backend: every kind of reason (sent, inactive, unmatched, near, chit-chat,
/// not sent) and both ways of keeping the message.
#[tokio::test]
async fn decision_rows_read_back_as_written() {
    let (_dir, stores) = stores().await;
    let reasons = |turn: usize| Reasons {
        domains: vec![DomainReason {
            domain: "weather".into(),
            included: true,
            stage: "keyword".into(),
            score: 0.75,
            reason: format!("turn {turn}"),
        }],
        inactive: vec!["mail".into()],
        unmatched: vec!["calendar".into()],
        near: [("files".to_owned(), 0.125)].into(),
        no_tool_needed: if turn == 3 {
            [("weather".to_owned(), 0.5)].into()
        } else {
            Default::default()
        },
        tools: vec!["get_forecast".into()],
        not_sent: vec![ToolReason(
            "get_alerts".into(),
            "weather".into(),
            "scored".into(),
            0.25,
        )],
        not_sent_left_out: turn,
        hint_tokens: 10 * turn,
        all_tools_tokens: 100,
        notes: vec![format!("note {turn}")],
    };
    let rows: Vec<DecisionRow> = (1..=4)
        .map(|turn| DecisionRow {
            at_ms: 5,
            session: Some("s".into()),
            turn: i64::try_from(turn).expect("turn"),
            message: if turn == 4 {
                MessageLogging::Sha256.apply("weather")
            } else {
                MessageLogging::Plain.apply("weather and mail please")
            },
            n_tools: 1,
            tokens: 42,
            reasons: reasons(turn),
        })
        .collect();
    assert!(rows[3].message.starts_with("sha256:") && !rows[3].message.contains("weather"));
    for t in stores {
        let store = &t.store;
        store.decisions_insert(rows.clone()).await.expect("insert");
        assert_eq!(
            store.decisions("s").await.expect("read"),
            rows,
            "{}",
            t.name
        );
        assert_eq!(
            store.decisions_tail(2).await.expect("tail"),
            rows[2..],
            "{}",
            t.name
        );
        assert_eq!(
            store.first_decision("s").await.expect("first").as_ref(),
            rows.first(),
            "{}",
            t.name
        );
    }
}

#[tokio::test]
async fn migrations_are_idempotent() {
    let (_dir, stores) = stores().await;
    for t in stores {
        t.store.setting_set("kept", "yes").await.expect("set");
        let again = t.reopen().await.expect("connect twice");
        let third = t.reopen().await.expect("connect three times");
        assert_eq!(schema_versions(&t).await, all_versions(), "{}", t.name);
        assert_eq!(
            third.settings_all().await.expect("all")["kept"],
            "yes",
            "{}",
            t.name
        );
        drop(again);
    }
}

#[tokio::test]
async fn newer_schema_is_refused_naming_both_versions() {
    let (_dir, stores) = stores().await;
    for t in stores {
        t.store.setting_set("kept", "yes").await.expect("set");
        bump_schema_version(&t, 999).await;
        let err = t.reopen().await.expect_err("must refuse");
        assert!(
            matches!(
                err,
                StoreError::SchemaTooNew {
                    found: 999,
                    known: SCHEMA_VERSION
                }
            ),
            "{}: {err:?}",
            t.name
        );
        let message = err.to_string();
        assert!(
            message.contains("999") && message.contains(&SCHEMA_VERSION.to_string()),
            "{}: {message}",
            t.name
        );
        // Nothing was touched: same versions, same data.
        assert_eq!(
            schema_versions(&t).await,
            [all_versions(), vec![999]].concat(),
            "{}",
            t.name
        );
        assert_eq!(
            t.store.settings_all().await.expect("all")["kept"],
            "yes",
            "{}",
            t.name
        );
    }
}

#[tokio::test]
async fn bad_urls_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Store::connect(Some("mysql://u:hunter2@h/db"), dir.path())
        .await
        .expect_err("scheme");
    assert!(err.to_string().contains("unknown scheme `mysql`"), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let err = Store::connect(Some("no-scheme"), dir.path())
        .await
        .expect_err("malformed");
    assert!(err.to_string().contains("expected sqlite:PATH"), "{err}");
    let err = Store::connect(Some("sqlite:"), dir.path())
        .await
        .expect_err("no path");
    assert!(err.to_string().contains("no file path"), "{err}");
    for malformed in [
        "postgres://u:hunter2@127.0.0.1:notaport/db",
        "postgres://u:hunter2@127.0.0.1/db?bogus_option=1",
        "postgresql://u:hunter2@[::1/db",
    ] {
        let err = Store::connect(Some(malformed), dir.path())
            .await
            .expect_err("malformed postgres URL");
        let message = err.to_string();
        assert!(
            matches!(err, StoreError::BadUrl { .. }),
            "{malformed}: {err:?}"
        );
        assert!(
            message.contains("u:***@127.0.0.1") || message.contains("u:***@["),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "{message}");
    }
}

#[tokio::test]
async fn unreachable_server_names_the_url_with_the_password_masked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    // Port 1 on loopback: nothing listens there, the connection is refused at once.
    let err = Store::connect(
        Some("postgres://me:hunter2@127.0.0.1:1/loadout"),
        dir.path(),
    )
    .await
    .expect_err("unreachable");
    let message = err.to_string();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert!(
        message.contains("postgres://me:***@127.0.0.1:1/loadout"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn audit_tail_returns_newest_rows_in_order() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let rows: Vec<AuditRow> = (0..5)
            .map(|i| AuditRow {
                at_ms: i,
                client: "test".into(),
                tool: format!("t{i}"),
                args: serde_json::json!({"i": i, "text": "ünïcödé"}),
                outcome: "ok".into(),
                detail: (i % 2 == 0).then(|| "even".to_owned()),
                duration_ms: 1.5,
            })
            .collect();
        t.store
            .audit_insert(rows[..2].to_vec())
            .await
            .expect("insert");
        t.store
            .audit_insert(rows[2..].to_vec())
            .await
            .expect("insert");
        let tail = t.store.audit_tail(2).await.expect("tail");
        assert_eq!(tail, rows[3..], "{}", t.name);
        assert_eq!(
            t.store.audit_tail(100).await.expect("tail"),
            rows,
            "{}",
            t.name
        );
    }
}

/// Waits until the store's settings listener (PostgreSQL only) is connected.
/// Connecting moves the generation like a notification does, so a cache filled
/// before that would be dropped at a moment the test does not choose.
async fn until_listening(store: &Store, within: Duration) {
    let Some(changes) = store.settings_changes() else {
        return;
    };
    let started = Instant::now();
    while !changes.borrow().listening {
        assert!(
            started.elapsed() < within,
            "the settings listener did not connect within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A setting written through one store (one replica) reaches another store's
/// settings cache within a second, without waiting for the TTL.
#[tokio::test]
async fn settings_written_elsewhere_reach_the_cache_within_a_second() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let writer = t.reopen().await.expect("second store");
        let settings = Settings::with_ttl(t.store.clone(), Duration::from_secs(3600));
        until_listening(&t.store, Duration::from_secs(5)).await;
        assert_eq!(settings.get("llm_model").await.expect("get"), None);
        assert!(settings.cached().is_some(), "{}", t.name);

        writer.setting_set("llm_model", "qwen").await.expect("set");
        let started = Instant::now();
        loop {
            if settings.get("llm_model").await.expect("get").as_deref() == Some("qwen") {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "{}: the write was not seen within 1 s",
                t.name
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        writer.setting_unset("llm_model").await.expect("unset");
        let started = Instant::now();
        while settings.get("llm_model").await.expect("get").is_some() {
            assert!(started.elapsed() < Duration::from_secs(1), "{}", t.name);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if t.is_postgres() {
            let changes = t.store.settings_changes().expect("a listener");
            assert!(changes.borrow().listening);
        } else {
            assert!(t.store.settings_changes().is_none());
        }
    }
}

/// A write that no notification announces (here: SQL behind the store's back, as
/// after a listener missed one) is still seen once the cache's lifetime is over.
#[tokio::test]
async fn the_cache_lifetime_is_the_backstop_for_a_missed_notification() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let StoreBackend::Postgres(pg) = t.store.backend() else {
            continue;
        };
        // Long enough that a loaded machine still reads once within it.
        let ttl = Duration::from_secs(3);
        let settings = Settings::with_ttl(t.store.clone(), ttl);
        let changes = t.store.settings_changes().expect("a listener");
        // The listener is connected (connecting moves the generation too) before the
        // write, whose own notification then comes first, so that neither can be
        // what makes the cache reload below.
        until_listening(&t.store, Duration::from_secs(5)).await;
        let before = changes.borrow().generation;
        t.store.setting_set("llm_model", "old").await.expect("set");
        let started = Instant::now();
        while changes.borrow().generation == before {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no notification"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            settings.get("llm_model").await.expect("get").as_deref(),
            Some("old")
        );
        let written = Instant::now();
        pg.client()
            .await
            .expect("client")
            .execute(
                "UPDATE settings SET value = 'new' WHERE key = 'llm_model'",
                &[],
            )
            .await
            .expect("update");
        // Unannounced, the cache still serves the old value...
        assert_eq!(
            settings.get("llm_model").await.expect("get").as_deref(),
            Some("old")
        );
        // ...until its lifetime ends.
        loop {
            match settings.get("llm_model").await.expect("get").as_deref() {
                Some("new") => break,
                _ => {
                    assert!(
                        written.elapsed() < ttl + Duration::from_secs(2),
                        "not seen after the TTL"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        assert!(
            written.elapsed() >= ttl / 2,
            "seen before the TTL: a notification?"
        );
    }
}

/// Stops the PostgreSQL server under a live store: operations fail with a clear
/// error while it is down and succeed again once it is back, on the same `Store`.
#[tokio::test]
async fn postgres_outage_is_reported_and_survived() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((t, mut outage)) =
        testing::postgres_outage_store(dir.path(), "PostgreSQL outage test").await
    else {
        return;
    };
    let store = &t.store;
    let settings = Settings::with_ttl(store.clone(), Duration::from_secs(3600));
    store.setting_set("before", "1").await.expect("set");
    assert_eq!(
        settings.get("before").await.expect("get").as_deref(),
        Some("1")
    );
    let changes = store.settings_changes().expect("listener");
    let generation_before = changes.borrow().generation;

    outage.stop();

    let err = store
        .setting_set("during", "1")
        .await
        .expect_err("the server is down");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("database unavailable"), "{message}");
    assert!(message.contains(&store.url_masked()), "{message}");
    let err = store.session_create().await.expect_err("down");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(store.messages("s").await.is_err());

    outage.end();
    let started = Instant::now();
    loop {
        match store.setting_set("after", "1").await {
            Ok(()) => break,
            Err(StoreError::Unavailable(_)) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the store did not recover: {e}"),
        }
    }
    let all = store.settings_all().await.expect("all");
    assert_eq!(all.get("before").map(String::as_str), Some("1"));
    assert_eq!(all.get("after").map(String::as_str), Some("1"));
    assert!(!all.contains_key("during"));
    let id = store.session_create().await.expect("sessions work again");
    assert_eq!(
        store
            .message_append(&id, "user", &serde_json::json!("hi"))
            .await
            .expect("append"),
        1
    );

    // The listener reconnected, and the outage dropped the cache.
    until_listening(store, Duration::from_secs(15)).await;
    assert!(changes.borrow().generation > generation_before);
    assert_eq!(
        settings.get("after").await.expect("get").as_deref(),
        Some("1")
    );
}

#[test]
fn passwords_are_masked_in_urls() {
    assert_eq!(
        mask_url_password("postgres://me:secret@db:5432/x"),
        "postgres://me:***@db:5432/x"
    );
    assert_eq!(mask_url_password("postgres://db/x"), "postgres://db/x");
    assert_eq!(
        mask_url_password("postgres://me:p@ss:w@rd@db:5432/x"),
        "postgres://me:***@db:5432/x"
    );
}

/// The SQLite store of `stores()`, with the path of its main file.
fn sqlite_of(stores: &[TestStore]) -> (&TestStore, std::path::PathBuf) {
    let t = stores
        .iter()
        .find(|t| !t.is_postgres())
        .expect("a SQLite store");
    let StoreBackend::Sqlite(sqlite) = t.store.backend() else {
        unreachable!("not PostgreSQL");
    };
    (t, sqlite.path().to_path_buf())
}

fn decision(session: &str, message: &str) -> DecisionRow {
    DecisionRow {
        at_ms: now_ms(),
        session: Some(session.into()),
        turn: 1,
        message: message.into(),
        n_tools: 1,
        tokens: 10,
        reasons: Reasons::default(),
    }
}

#[tokio::test]
async fn a_new_sqlite_decision_log_has_large_pages_and_an_old_one_keeps_its_own() {
    let (_dir, stores) = stores().await;
    let (t, main) = sqlite_of(&stores);
    let page_size = |path: &std::path::Path| -> i64 {
        let conn = rusqlite::Connection::open(path).expect("open");
        conn.query_row("PRAGMA page_size", [], |r| r.get(0))
            .expect("page size")
    };
    let log = sqlite::decisions_path(&main);
    assert_eq!(page_size(&log), 16 * 1024);
    assert_eq!(
        page_size(&main),
        4096,
        "the main file keeps SQLite's default"
    );
    t.store
        .decisions_insert(vec![decision("s-1", "logged")])
        .await
        .expect("log");
    // A log file made with 4 KB pages by an older binary stays as it is.
    let old = tempfile::tempdir().expect("tempdir");
    let old_main = old.path().join("loadout.db");
    let old_log = sqlite::decisions_path(&old_main);
    rusqlite::Connection::open(&old_log)
        .and_then(|c| c.execute_batch("PRAGMA page_size = 4096; CREATE TABLE t(x);"))
        .expect("old log");
    let store = Store::connect(None, old.path()).await.expect("open");
    store
        .decisions_insert(vec![decision("s-1", "logged")])
        .await
        .expect("log");
    assert_eq!(store.decisions("s-1").await.expect("read").len(), 1);
    assert_eq!(page_size(&old_log), 4096);
}

#[tokio::test]
async fn an_unreadable_sqlite_decision_log_is_moved_aside_and_started_anew() {
    let (_dir, stores) = stores().await;
    let (t, main) = sqlite_of(&stores);
    t.store.setting_set("kept", "yes").await.expect("set");
    t.store
        .decisions_insert(vec![decision("s-1", "before the power cut")])
        .await
        .expect("log");
    let log = sqlite::decisions_path(&main);
    assert!(log.exists(), "{}", log.display());
    // What a power cut during an unsynced write can leave behind.
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", log.display()));
    }
    std::fs::write(&log, b"not a database at all, just bytes".repeat(200)).expect("garble");

    let reopened = t.reopen().await.expect("opens despite the unreadable log");
    assert_eq!(reopened.settings_all().await.expect("all")["kept"], "yes");
    assert_eq!(reopened.decisions("s-1").await.expect("read"), vec![]);
    reopened
        .decisions_insert(vec![decision("s-2", "after")])
        .await
        .expect("log again");
    assert_eq!(reopened.decisions("s-2").await.expect("read").len(), 1);
    let dir = log.parent().expect("dir");
    let aside: Vec<_> = std::fs::read_dir(dir)
        .expect("list")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".decisions.db.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "the unreadable file is kept: {aside:?}");
}

#[tokio::test]
async fn a_newer_sqlite_decision_log_schema_is_refused() {
    let (_dir, stores) = stores().await;
    let (t, _) = sqlite_of(&stores);
    let StoreBackend::Sqlite(sqlite) = t.store.backend() else {
        unreachable!("SQLite");
    };
    sqlite
        .call(|c| {
            c.execute(
                "INSERT INTO decisions.schema_version(version, applied_ms) VALUES (99, 0)",
                [],
            )?;
            Ok(())
        })
        .await
        .expect("bump");
    let err = t.reopen().await.expect_err("must refuse");
    assert!(
        matches!(err, StoreError::SchemaTooNew { found: 99, .. }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_calls_join_their_turn_and_sessions_list_by_activity() {
    use serde_json::json;
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        store
            .turn_append("older", &json!("first"), &[])
            .await
            .expect("turn");
        tokio::time::sleep(Duration::from_millis(5)).await;
        let since = now_ms();
        store
            .turn_append("newer", &json!("list my containers"), &[])
            .await
            .expect("turn");
        store
            .calls_reported(
                "newer",
                1,
                &names(&["list_containers", "restart_container"]),
            )
            .await
            .expect("report");
        // A turn the session has not reached, and a session that does not exist: none.
        store
            .calls_reported("newer", 2, &names(&["stale"]))
            .await
            .expect("report");
        store
            .calls_reported("nobody", 1, &names(&["stale"]))
            .await
            .expect("report");
        assert!(
            store
                .calls_reported("../x", 1, &names(&["x"]))
                .await
                .is_err()
        );

        let rows = store.messages("newer").await.expect("messages");
        let tools: Vec<(i64, &str)> = rows
            .iter()
            .filter(|r| r.role == "tool")
            .map(|r| (r.turn, r.content["name"].as_str().unwrap_or("")))
            .collect();
        assert_eq!(
            tools,
            [(1, "list_containers"), (1, "restart_container")],
            "{}",
            t.name
        );
        assert!(!store.session_exists("nobody").await.expect("exists"));
        // The next turn sees them as the latest turn's calls, as it sees a chat's.
        let snapshot = store.session_snapshot("newer").await.expect("snapshot");
        assert_eq!(snapshot.recent_calls.len(), 2, "{}", t.name);

        let all = store.sessions_active_since(0, 10).await.expect("sessions");
        assert_eq!(all, ["newer", "older"], "{}", t.name);
        let recent = store
            .sessions_active_since(since, 10)
            .await
            .expect("sessions");
        assert_eq!(recent, ["newer"], "{}", t.name);
        assert_eq!(
            store.sessions_active_since(0, 1).await.expect("sessions"),
            ["newer"]
        );
    }
}

fn learn(session: Option<&str>, message: &str, tools: &[&str], at_ms: i64) -> LearnedWrite {
    LearnedWrite {
        at_ms,
        session: session.map(str::to_owned),
        source: "route".into(),
        message: message.into(),
        tools: tools.iter().map(|t| (*t).to_owned()).collect(),
        model: None,
        vector: None,
    }
}

fn with_vector(mut write: LearnedWrite, model: &str, vector: &[f32]) -> LearnedWrite {
    write.model = Some(model.into());
    write.vector = Some(vector.to_vec());
    write
}

/// Issue 29: entries read back with their tools, source and vectors (only of the
/// model asked for); every write moves the version; forgetting a tool keeps entries
/// that still name another.
#[tokio::test]
async fn learned_entries_roundtrip_and_are_forgotten() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        let v0 = store.learned_version().await.expect("version");
        let added = store
            .learned_insert(
                with_vector(
                    learn(
                        Some("s1"),
                        "  what's the weather in Oslo ",
                        &["get_weather"],
                        1_000,
                    ),
                    "enc",
                    &[1.0, 0.0, 0.5],
                ),
                100,
            )
            .await
            .expect("insert");
        assert!(
            matches!(added, LearnOutcome::Added { .. }),
            "{}: {added:?}",
            t.name
        );
        store
            .learned_insert(
                learn(
                    None,
                    "note it and remind me",
                    &["write_note", "set_reminder"],
                    2_000,
                ),
                100,
            )
            .await
            .expect("insert");
        let v1 = store.learned_version().await.expect("version");
        assert!(v1 > v0, "{}", t.name);

        let rows = store.learned_rows(None, Some("enc")).await.expect("rows");
        assert_eq!(rows.len(), 2, "{}", t.name);
        assert_eq!(rows[0].message, "what's the weather in Oslo");
        assert_eq!(rows[0].tools, vec!["get_weather".to_owned()]);
        assert_eq!(rows[0].session.as_deref(), Some("s1"));
        assert_eq!(rows[0].source, "route");
        assert_eq!(rows[0].vector, Some(vec![1.0, 0.0, 0.5]), "{}", t.name);
        assert_eq!(
            rows[1].tools,
            vec!["set_reminder".to_owned(), "write_note".to_owned()]
        );
        let other_model = store.learned_rows(None, Some("other")).await.expect("rows");
        assert_eq!(other_model[0].vector, None, "{}", t.name);
        let one_tool = store
            .learned_rows(Some("write_note"), None)
            .await
            .expect("rows");
        assert_eq!(one_tool.len(), 1);
        assert_eq!(one_tool[0].tools.len(), 2, "an entry keeps all its tools");

        let summary = store.learned_summary(None).await.expect("summary");
        let names: Vec<&str> = summary.iter().map(|s| s.tool.as_str()).collect();
        assert_eq!(
            names,
            ["get_weather", "set_reminder", "write_note"],
            "{}",
            t.name
        );
        assert_eq!(summary[0].sources.get("route"), Some(&1));

        assert_eq!(
            store
                .learned_forget(Some("write_note"))
                .await
                .expect("forget"),
            1
        );
        let rows = store.learned_rows(None, None).await.expect("rows");
        assert_eq!(
            rows.len(),
            2,
            "{}: the entry still names set_reminder",
            t.name
        );
        assert_eq!(rows[1].tools, vec!["set_reminder".to_owned()]);
        assert!(store.learned_version().await.expect("version") > v1);
        store.learned_forget(None).await.expect("forget all");
        assert!(
            store
                .learned_rows(None, None)
                .await
                .expect("rows")
                .is_empty()
        );
    }
}

/// Issue 29: a session teaches a tool at most once a day; another session, the next
/// day, or a write with no session (examples, imports) still teach it.
#[tokio::test]
async fn a_session_teaches_a_tool_once_a_day() {
    let (_dir, stores) = stores().await;
    const DAY: i64 = 24 * 60 * 60 * 1000;
    for t in stores {
        let store = &t.store;
        let day = 20_000 * DAY;
        let first = store
            .learned_insert(
                learn(Some("steer"), "convert 5 usd", &["convert"], day),
                100,
            )
            .await
            .expect("insert");
        assert!(matches!(first, LearnOutcome::Added { .. }));
        let again = store
            .learned_insert(
                learn(Some("steer"), "delete all my files", &["convert"], day + 5),
                100,
            )
            .await
            .expect("insert");
        assert_eq!(again, LearnOutcome::Nothing, "{}", t.name);
        // Of a turn naming two tools, only the one not taught today is learned.
        let partly = store
            .learned_insert(
                learn(
                    Some("steer"),
                    "convert and note it",
                    &["convert", "write_note"],
                    day + 9,
                ),
                100,
            )
            .await
            .expect("insert");
        match partly {
            LearnOutcome::Added { tools, .. } => assert_eq!(tools, ["write_note"]),
            other => panic!("{}: {other:?}", t.name),
        }
        for write in [
            learn(Some("other"), "delete all my files", &["convert"], day + 10),
            learn(
                Some("steer"),
                "what is 5 usd in eur",
                &["convert"],
                day + DAY,
            ),
            learn(None, "swap euros for yen", &["convert"], day + 11),
            learn(None, "swap dollars for yen", &["convert"], day + 12),
        ] {
            let outcome = store
                .learned_insert(write.clone(), 100)
                .await
                .expect("insert");
            assert!(
                matches!(outcome, LearnOutcome::Added { .. }),
                "{}: {write:?} → {outcome:?}",
                t.name
            );
        }
        assert_eq!(
            store
                .learned_rows(Some("convert"), None)
                .await
                .expect("rows")
                .len(),
            5,
            "{}",
            t.name
        );
    }
}

/// Issue 29: a repeat (same words up to case and punctuation, or a near-identical
/// vector of the same encoder) with the same tools merges into the stored entry; the
/// same words for other tools, or a vector of another encoder, do not.
#[tokio::test]
async fn near_duplicates_merge() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        let LearnOutcome::Added { id, .. } = store
            .learned_insert(
                with_vector(
                    learn(None, "Weather in Oslo?", &["get_weather"], 10),
                    "enc",
                    &[1.0, 0.0],
                ),
                100,
            )
            .await
            .expect("insert")
        else {
            panic!("not added");
        };
        let same_words = store
            .learned_insert(learn(None, "weather   in oslo", &["get_weather"], 20), 100)
            .await
            .expect("insert");
        assert!(
            matches!(same_words, LearnOutcome::Merged { id: m, .. } if m == id),
            "{}: {same_words:?}",
            t.name
        );
        let close_vector = store
            .learned_insert(
                with_vector(
                    learn(None, "is it raining in Oslo", &["get_weather"], 30),
                    "enc",
                    &[0.99, 0.05],
                ),
                100,
            )
            .await
            .expect("insert");
        assert!(
            matches!(close_vector, LearnOutcome::Merged { id: m, .. } if m == id),
            "{}: {close_vector:?}",
            t.name
        );
        for write in [
            with_vector(
                learn(None, "is it sunny in Oslo", &["get_weather"], 40),
                "other",
                &[1.0, 0.0],
            ),
            learn(None, "weather in oslo", &["get_weather", "write_note"], 50),
            with_vector(
                learn(None, "how warm is Bergen", &["get_weather"], 60),
                "enc",
                &[0.0, 1.0],
            ),
        ] {
            let outcome = store
                .learned_insert(write.clone(), 100)
                .await
                .expect("insert");
            assert!(
                matches!(outcome, LearnOutcome::Added { .. }),
                "{}: {write:?} → {outcome:?}",
                t.name
            );
        }
        let rows = store.learned_rows(None, None).await.expect("rows");
        let merged = rows.iter().find(|r| r.id == id).expect("merged entry");
        assert_eq!(merged.n_merged, 3, "{}", t.name);
        assert_eq!(merged.at_ms, 30, "{}: the merge moves its time", t.name);
        assert_eq!(rows.len(), 4, "{}", t.name);
    }
}

/// Issue 29: each tool keeps its newest entries; an entry that loses its last tool
/// goes, one that still names another tool stays.
#[tokio::test]
async fn each_tool_keeps_its_newest_entries() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        store
            .learned_insert(
                learn(None, "convert and note", &["convert", "write_note"], 1),
                3,
            )
            .await
            .expect("insert");
        for i in 2..=6 {
            store
                .learned_insert(
                    learn(None, &format!("convert sum number {i}"), &["convert"], i),
                    3,
                )
                .await
                .expect("insert");
        }
        let convert = store
            .learned_rows(Some("convert"), None)
            .await
            .expect("rows");
        let times: Vec<i64> = convert.iter().map(|r| r.at_ms).collect();
        assert_eq!(times, [4, 5, 6], "{}", t.name);
        let all = store.learned_rows(None, None).await.expect("rows");
        assert_eq!(
            all.len(),
            4,
            "{}: entries with no tool left are gone",
            t.name
        );
        assert_eq!(all[0].tools, ["write_note"], "{}", t.name);
    }
}

/// Issue 29: an entry learned without a vector gets one later (the version moves);
/// one that has a vector keeps it.
#[tokio::test]
async fn vectors_are_set_on_entries_without_one() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let store = &t.store;
        let LearnOutcome::Added { id: plain, .. } = store
            .learned_insert(learn(None, "swap euros for yen", &["convert"], 1), 100)
            .await
            .expect("insert")
        else {
            panic!("not added");
        };
        let LearnOutcome::Added { id: embedded, .. } = store
            .learned_insert(
                with_vector(
                    learn(None, "weather in oslo", &["get_weather"], 2),
                    "old",
                    &[1.0, 0.0],
                ),
                100,
            )
            .await
            .expect("insert")
        else {
            panic!("not added");
        };
        let before = store.learned_version().await.expect("version");
        let n = store
            .learned_set_vectors(
                "enc",
                vec![(plain, vec![0.0, 1.0]), (embedded, vec![0.5, 0.5])],
            )
            .await
            .expect("set");
        assert_eq!(n, 1, "{}", t.name);
        assert!(store.learned_version().await.expect("version") > before);
        let rows = store.learned_rows(None, Some("enc")).await.expect("rows");
        assert_eq!(rows[0].vector, Some(vec![0.0, 1.0]), "{}", t.name);
        assert_eq!(rows[1].model.as_deref(), Some("old"), "{}", t.name);
        assert_eq!(rows[1].vector, None, "{}: not of `enc`", t.name);
    }
}

/// Figures for docs/performance.md, not a test (it asserts nothing about time):
/// `cargo test --release -p loadout-store --lib -- --ignored learned_memory_figures
/// --nocapture`. Writes 5,000 entries over 50 tools (384-dimensional vectors, a
/// session each; every 10th repeats the words of the one before, for another tool,
/// so it is kept apart) and reads them back as an index build does. (The index
/// build itself is the router's: the store has no router.)
#[tokio::test]
#[ignore]
async fn learned_memory_figures() {
    let (_dir, stores) = stores().await;
    let tools: Vec<String> = (0..50).map(|t| format!("tool_{t}")).collect();
    for t in stores {
        let store = &t.store;
        let started = Instant::now();
        let n = 5_000;
        for i in 0..n {
            let text = if i % 10 == 9 {
                format!("message number {}", i - 1)
            } else {
                format!("message number {i}")
            };
            let vector: Vec<f32> = (0..384)
                .map(|d| ((i * 31 + d * 7 + i * d) % 97) as f32 - 48.0)
                .collect();
            let write = with_vector(
                learn(Some(&format!("s{i}")), &text, &[&tools[i % 50]], i as i64),
                "enc",
                &vector,
            );
            store.learned_insert(write, 200).await.expect("insert");
        }
        let inserted = started.elapsed();
        let started = Instant::now();
        let rows = store.learned_rows(None, Some("enc")).await.expect("rows");
        let read = started.elapsed();
        println!(
            "{}: {n} writes in {:.2} s ({:.0} µs each); {} entries read in {:.0} ms",
            t.name,
            inserted.as_secs_f64(),
            inserted.as_secs_f64() * 1e6 / n as f64,
            rows.len(),
            read.as_secs_f64() * 1e3,
        );
    }
}

/// Issue 36: a deleted WAL lost every setting not yet checkpointed. Each settings
/// write is checkpointed before it is acknowledged: the main file alone, copied
/// without its WAL, holds it.
#[tokio::test]
async fn an_acknowledged_setting_is_in_the_main_file_without_its_wal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = crate::SqliteStore::open(&dir.path().join("loadout.db"))
        .await
        .expect("open");
    for i in 0..30 {
        store
            .setting_set(&format!("durable_{i}"), "kept")
            .await
            .expect("set");
    }
    store.setting_unset("durable_0").await.expect("unset");
    // What a lost WAL leaves: the main file as it is now, nothing else.
    let copy = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        dir.path().join("loadout.db"),
        copy.path().join("loadout.db"),
    )
    .expect("copy the main file");
    let conn = rusqlite::Connection::open(copy.path().join("loadout.db")).expect("open the copy");
    let n: i64 = conn
        .query_row(
            "SELECT count(*) FROM settings WHERE key LIKE 'durable_%'",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(n, 29);
    drop(store);
}

/// Issue 40: clients by name and token hash, on every backend; a name is taken once
/// and revoking removes the token with the client.
#[tokio::test]
async fn clients_are_added_found_by_token_hash_listed_and_revoked() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let row = crate::ClientRow {
            name: "agent-a".into(),
            token_sha256: sha256_hex("token-of-agent-a-0123456789"),
            domains: vec!["memory".into()],
            tools: vec!["calculate".into()],
            rate_per_min: Some(30),
            read_only: true,
            created_ms: 7,
        };
        assert!(
            t.store.client_insert(row.clone()).await.expect("insert"),
            "{}",
            t.name
        );
        assert!(
            !t.store
                .client_insert(row.clone())
                .await
                .expect("insert again"),
            "{}",
            t.name
        );
        assert_eq!(
            t.store.clients_list().await.expect("list"),
            std::slice::from_ref(&row),
            "{}",
            t.name
        );
        let found = t
            .store
            .client_by_token_hash(&row.token_sha256)
            .await
            .expect("find");
        assert_eq!(found.as_ref(), Some(&row), "{}", t.name);
        assert!(
            t.store.client_revoke("agent-a").await.expect("revoke"),
            "{}",
            t.name
        );
        assert!(
            !t.store
                .client_revoke("agent-a")
                .await
                .expect("revoke again"),
            "{}",
            t.name
        );
        assert_eq!(
            t.store
                .client_by_token_hash(&row.token_sha256)
                .await
                .expect("find"),
            None,
            "{}",
            t.name
        );
    }
}

/// Issue 40: a session belongs to who started it, on every backend: its client, or
/// the operator (who may use every session); another client may not.
#[tokio::test]
async fn a_session_is_claimed_by_its_client_and_refused_to_others() {
    let (_dir, stores) = stores().await;
    for t in stores {
        let s = &t.store;
        assert!(
            s.session_claim("talk-a", Some("agent-a"))
                .await
                .expect("claim"),
            "{}",
            t.name
        );
        assert!(
            s.session_exists("talk-a").await.expect("exists"),
            "{}",
            t.name
        );
        assert!(
            s.session_claim("talk-a", Some("agent-a"))
                .await
                .expect("again"),
            "{}",
            t.name
        );
        assert!(
            !s.session_claim("talk-a", Some("agent-b"))
                .await
                .expect("other"),
            "{}",
            t.name
        );
        assert!(
            s.session_claim("talk-a", None).await.expect("operator"),
            "{}",
            t.name
        );
        // The operator's own sessions are not a client's.
        assert!(
            s.session_claim("talk-o", None).await.expect("operator"),
            "{}",
            t.name
        );
        assert!(
            !s.session_claim("talk-o", Some("agent-a"))
                .await
                .expect("client"),
            "{}",
            t.name
        );
        let id = s.session_create_for(Some("agent-b")).await.expect("create");
        assert!(
            s.session_claim(&id, Some("agent-b")).await.expect("own"),
            "{}",
            t.name
        );
        assert!(
            !s.session_claim(&id, Some("agent-a")).await.expect("other"),
            "{}",
            t.name
        );
        assert!(
            s.session_claim("bad id!", None).await.is_err(),
            "{}",
            t.name
        );
    }
}
