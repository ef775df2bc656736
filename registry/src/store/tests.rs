use super::*;

#[tokio::test]
async fn settings_roundtrip_and_unset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path()).await.expect("open");
    store.setting_set("weather_key", "abc").await.expect("set");
    assert_eq!(
        store.settings_all().await.expect("all")["weather_key"],
        "abc"
    );
    assert!(store.setting_unset("weather_key").await.expect("unset"));
    assert!(
        !store
            .setting_unset("weather_key")
            .await
            .expect("unset again")
    );
    assert!(store.setting_set("Bad Key", "x").await.is_err());
}

#[tokio::test]
async fn turns_count_user_messages_and_survive_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open_dir(dir.path()).await.expect("open");
        let id = "s1";
        assert_eq!(
            store
                .message_append(id, "user", &serde_json::json!("hi"))
                .await
                .expect("append"),
            1
        );
        assert_eq!(
            store
                .message_append(id, "assistant", &serde_json::json!("hello"))
                .await
                .expect("append"),
            1
        );
        assert_eq!(
            store
                .message_append(id, "user", &serde_json::json!("more"))
                .await
                .expect("append"),
            2
        );
    }
    let store = Store::open_dir(dir.path()).await.expect("reopen");
    assert_eq!(store.session_turn("s1").await.expect("turn"), 2);
    assert_eq!(store.messages("s1").await.expect("messages").len(), 3);
}

#[tokio::test]
async fn newer_schema_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("loadout.db");
    drop(Store::open_dir(dir.path()).await.expect("open"));
    {
        let conn = rusqlite::Connection::open(&path).expect("raw open");
        conn.execute(
            "INSERT INTO schema_version(version, applied_ms) VALUES (999, 0)",
            [],
        )
        .expect("bump");
    }
    let err = Store::open_dir(dir.path()).await.expect_err("must refuse");
    let message = err.to_string();
    assert!(
        message.contains("999") && message.contains(&sqlite::SCHEMA_VERSION.to_string()),
        "{message}"
    );
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
}

#[tokio::test]
async fn audit_tail_returns_newest_rows_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path()).await.expect("open");
    let rows: Vec<AuditRow> = (0..5)
        .map(|i| AuditRow {
            at_ms: i,
            client: "test".into(),
            tool: format!("t{i}"),
            args: serde_json::json!({}),
            outcome: "ok".into(),
            detail: None,
            duration_ms: 1.0,
        })
        .collect();
    store.audit_insert(&rows).await.expect("insert");
    let tail = store.audit_tail(2).await.expect("tail");
    assert_eq!(
        tail.iter().map(|r| r.tool.as_str()).collect::<Vec<_>>(),
        ["t3", "t4"]
    );
}

#[test]
fn passwords_are_masked_in_urls() {
    assert_eq!(
        mask_url_password("postgres://me:secret@db:5432/x"),
        "postgres://me:***@db:5432/x"
    );
    assert_eq!(mask_url_password("postgres://db/x"), "postgres://db/x");
}
