//! Calls each tool through the registry, as a server would, on every backend
//! [`loadout_store::testing::test_stores`] yields (SQLite always, PostgreSQL when
//! `LOADOUT_TEST_POSTGRES_URL` is set).

use std::sync::Arc;

use loadout::{Registry, Settings, ToolContext, ToolError};
use loadout_store::testing::{TestStore, test_stores};
use serde_json::{Value, json};

struct Harness {
    /// The backend's name, for failure messages.
    name: &'static str,
    registry: Arc<Registry>,
    ctx: ToolContext,
    _store: TestStore,
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
            _store: t,
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

    async fn remember(&self, content: &str, tags: &[&str]) -> i64 {
        let stored = self
            .ok("remember", json!({"content": content, "tags": tags}))
            .await;
        stored["id"].as_i64().expect("id")
    }

    async fn recall_ids(&self, query: &str) -> Vec<i64> {
        let found = self.ok("recall", json!({"query": query})).await;
        found
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|m| m["id"].as_i64())
            .collect()
    }
}

#[tokio::test]
async fn recall_ranks_by_relevance() {
    let (_dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        let seat = h
            .remember("Mina prefers a window seat on long flights", &["travel"])
            .await;
        let airline = h
            .remember(
                "Mina's favourite airline is the one with good flights to Jeju",
                &[],
            )
            .await;
        let coffee = h.remember("Mina drinks her coffee black", &["food"]).await;
        let korean = h.remember("민아는 제주도 여행을 좋아한다", &["여행"]).await;

        // Both words match the first memory; one matches the second.
        assert_eq!(
            h.recall_ids("window seat flights").await[..2],
            [seat, airline]
        );
        assert_eq!(h.recall_ids("coffee").await, [coffee]);
        // Prefix matching: "flight" finds "flights"; case and accents are ignored.
        assert_eq!(h.recall_ids("FLIGHT").await.len(), 2);
        assert_eq!(h.recall_ids("cóffee").await, [coffee]);
        assert_eq!(h.recall_ids("제주도").await, [korean]);
        // Tags are searched too, and filter.
        assert_eq!(h.recall_ids("여행").await, [korean]);
        let filtered = h
            .ok("recall", json!({"query": "Mina", "tag": "FOOD"}))
            .await;
        assert_eq!(filtered.as_array().map(Vec::len), Some(1));
        assert_eq!(filtered[0]["id"], coffee);
        assert_eq!(filtered[0]["score"], json!(1.0));
        // Scores are relevance from 0 to 1 relative to the best match, 3 decimals:
        // not the raw BM25 of a word every memory has (about 2e-6).
        let ranked = h.ok("recall", json!({"query": "Mina window seat"})).await;
        let scores: Vec<f64> = ranked
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|m| m["score"].as_f64())
            .collect();
        assert_eq!(scores.len(), 3, "{ranked}");
        assert_eq!(scores[0], 1.0, "{ranked}");
        for pair in scores.windows(2) {
            assert!(pair[0] >= pair[1], "{ranked}");
        }
        for score in &scores {
            assert!(
                (0.0..=1.0).contains(score) && (score * 1000.0).fract() == 0.0,
                "{ranked}"
            );
        }
        assert!(
            scores[2] < 0.9,
            "the memory matching only `Mina` ranks well below: {ranked}"
        );

        let limited = h.ok("recall", json!({"query": "Mina", "limit": 2})).await;
        assert_eq!(limited.as_array().map(Vec::len), Some(2));
        assert!(h.recall_ids("submarine").await.is_empty());
    }
}

#[tokio::test]
async fn fts_syntax_in_queries_is_plain_text() {
    let (_dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        let id = h
            .remember("The wifi password is in the red notebook", &[])
            .await;
        let hostile = [
            "\"unbalanced quote",
            "wifi AND OR NOT",
            "NEAR(wifi password, 2)",
            "content:wifi",
            "wifi*",
            "^wifi",
            "(wifi",
            "wifi) OR (",
            "'; DROP TABLE memory_items; --",
            "{content tags}: wifi",
            "-wifi +password",
        ];
        for query in hostile {
            let found = h.call("recall", json!({"query": query})).await;
            assert!(found.is_ok(), "{query}: {found:?}");
        }
        assert_eq!(h.recall_ids("\"wifi").await, [id]);
        assert_eq!(h.recall_ids("NEAR(wifi").await, [id]);

        for query in ["", "  ", "*** \"\" ()"] {
            let message = h.err("recall", json!({"query": query})).await;
            assert!(message.contains("no searchable words"), "{message}");
        }
        // The table survived.
        assert_eq!(h.recall_ids("notebook").await, [id]);
    }
}

#[tokio::test]
async fn update_forget_and_list() {
    let (_dir, harnesses) = harnesses().await;
    for h in harnesses {
        eprintln!("backend: {}", h.name);
        let id = h.remember("Jun's birthday is March 3", &["birthday"]).await;
        let other = h.remember("Jun likes board games", &[]).await;

        let duplicate = h
            .ok(
                "remember",
                json!({"content": "  Jun's birthday is March 3 "}),
            )
            .await;
        assert_eq!(duplicate["id"], id);
        assert_eq!(duplicate["duplicate"], true);

        let updated = h
            .ok(
                "update_memory",
                json!({"id": id, "content": "Jun's birthday is March 4"}),
            )
            .await;
        assert_eq!(updated["content"], "Jun's birthday is March 4");
        assert_eq!(updated["tags"], json!(["birthday"]));
        // The index follows the update.
        assert_eq!(h.recall_ids("March 4").await[0], id);
        let retagged = h
            .ok(
                "update_memory",
                json!({"id": id, "tags": ["Family", "family", "dates"]}),
            )
            .await;
        assert_eq!(retagged["tags"], json!(["family", "dates"]));
        assert!(h.recall_ids("birthday").await.contains(&id));
        assert_eq!(
            h.ok("recall", json!({"query": "jun", "tag": "birthday"}))
                .await,
            json!([])
        );

        let message = h.err("update_memory", json!({"id": id})).await;
        assert!(message.contains("nothing to change"), "{message}");
        let message = h
            .err("update_memory", json!({"id": 999, "content": "x"}))
            .await;
        assert!(message.contains("no memory with id 999"), "{message}");

        let page = h.ok("list_memories", json!({})).await;
        assert_eq!(page["total"], 2);
        let page = h
            .ok("list_memories", json!({"tag": "family", "limit": 5}))
            .await;
        assert_eq!(page["total"], 1);
        assert_eq!(page["memories"][0]["id"], id);

        let forgotten = h.ok("forget", json!({"id": id})).await;
        assert_eq!(forgotten["content"], "Jun's birthday is March 4");
        assert!(h.recall_ids("birthday March").await.is_empty());
        let message = h.err("forget", json!({"id": id})).await;
        assert!(message.contains("no memory with id"), "{message}");
        assert_eq!(h.recall_ids("board games").await, [other]);

        let message = h.err("remember", json!({"content": "   "})).await;
        assert!(message.contains("empty"), "{message}");
    }
}

/// N4 of issue 36: `remember` reads (is this a duplicate?) and then writes in one
/// transaction; begun deferred, a commit by another connection in between made
/// SQLite refuse the write at once ("database is locked") instead of waiting. Here a
/// second store on the same files (as `loadout call` beside `loadout serve`) writes
/// settings while 20 tasks remember 10 things each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_wait_instead_of_failing() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        if h.name != "sqlite" {
            continue;
        }
        let other = loadout_store::Store::connect(Some(&h._store.url), &h._store.data_dir)
            .await
            .expect("a second store on the same data");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    other
                        .setting_set("memory_probe", &n.to_string())
                        .await
                        .expect("the other store's write");
                    n += 1;
                }
                n
            })
        };
        let h = Arc::new(h);
        let mut tasks = Vec::new();
        for task in 0..20 {
            let h = h.clone();
            tasks.push(tokio::spawn(async move {
                let mut errors = Vec::new();
                for i in 0..10 {
                    let args = json!({"content": format!("note {task}-{i}"), "tags": ["load"]});
                    if let Err(e) = h.call("remember", args).await {
                        errors.push(e.to_string());
                    }
                }
                errors
            }));
        }
        let mut errors = Vec::new();
        for task in tasks {
            errors.extend(task.await.expect("task"));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let n_other = writer.await.expect("writer");
        assert!(
            errors.is_empty(),
            "{} failed: {:?}",
            errors.len(),
            &errors[..errors.len().min(3)]
        );
        assert!(n_other > 0);
        let listed = h.ok("list_memories", json!({"limit": 200})).await;
        assert_eq!(listed["total"], 200, "{listed}");
    }
    drop(dir);
}

/// Issue 36: `remember` stored NUL characters. Content keeps line breaks and tabs;
/// tags take no control character at all.
#[tokio::test]
async fn memories_refuse_control_characters() {
    let (dir, harnesses) = harnesses().await;
    for h in harnesses {
        for content in [
            "nul\u{0}inside",
            "escape \u{1b}[31m red",
            "del\u{7f}",
            "c1\u{85}inside",
        ] {
            let message = h
                .err("remember", json!({"content": content, "tags": []}))
                .await;
            assert!(
                message.contains("control character"),
                "{}: {content:?}: {message}",
                h.name
            );
        }
        for tag in ["two\nlines", "tab\tbed", "nul\u{0}", "flip\u{202E}"] {
            let message = h
                .err("remember", json!({"content": "fine", "tags": [tag]}))
                .await;
            assert!(
                message.contains("control character"),
                "{}: {tag:?}: {message}",
                h.name
            );
        }
        let id = h.remember("line one\n\tline two", &["ok"]).await;
        let message = h
            .err("update_memory", json!({"id": id, "content": "bad\u{0}"}))
            .await;
        assert!(
            message.contains("control character"),
            "{}: {message}",
            h.name
        );
        let listed = h.ok("list_memories", json!({})).await;
        assert_eq!(listed["total"], 1, "{}: {listed}", h.name);
    }
    drop(dir);
}
