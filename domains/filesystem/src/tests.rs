//! Calls each tool through the registry, as a server would. The tree under test:
//!
//! ```text
//! <tmp>/data            the store's data dir
//! <tmp>/root            the allowed root
//! <tmp>/root/docs/...   files inside
//! <tmp>/outside/...     a secret the tools must never reach
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use loadout::{Registry, Settings, ToolContext, ToolError};
use loadout_store::Store;
use serde_json::{Value, json};

struct Harness {
    dir: tempfile::TempDir,
    registry: Arc<Registry>,
    ctx: ToolContext,
}

async fn unconfigured() -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open_dir(&dir.path().join("data"))
        .await
        .expect("store");
    let registry = Arc::new(Registry::from_inventory().expect("registry"));
    let ctx = ToolContext::new(registry.clone(), Settings::new(store));
    let h = Harness { dir, registry, ctx };
    fs::create_dir_all(h.root().join("docs/deep/deeper")).expect("mkdir");
    fs::create_dir_all(h.outside()).expect("mkdir");
    fs::write(h.root().join("docs/notes.txt"), "hello notes\n").expect("write");
    fs::write(h.root().join("docs/Report-01.PDF"), b"%PDF\x00\x01binary").expect("write");
    fs::write(h.root().join("docs/deep/deeper/plan.txt"), "plan").expect("write");
    fs::write(h.root().join(".hidden.txt"), "hidden").expect("write");
    fs::write(h.outside().join("secret.txt"), "TOP SECRET").expect("write");
    h
}

async fn harness() -> Harness {
    let h = unconfigured().await;
    h.set_roots(&json!([h.root()]).to_string()).await;
    h
}

impl Harness {
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    async fn set_roots(&self, value: &str) {
        self.ctx
            .settings()
            .set("filesystem_roots", value)
            .await
            .expect("set roots");
    }

    async fn call(&self, tool: &str, args: Value) -> Result<Value, ToolError> {
        self.registry.call(tool, args, self.ctx.clone()).await
    }

    async fn ok(&self, tool: &str, args: Value) -> Value {
        match self.call(tool, args).await {
            Ok(value) => value,
            Err(e) => panic!("{tool} failed: {e}"),
        }
    }

    async fn err(&self, tool: &str, args: Value) -> String {
        match self.call(tool, args).await {
            Ok(value) => panic!("{tool} should fail, returned {value}"),
            Err(e) => e.to_string(),
        }
    }

    fn secret_intact(&self) {
        let secret = fs::read_to_string(self.outside().join("secret.txt")).expect("secret");
        assert_eq!(secret, "TOP SECRET");
        let names: Vec<_> = fs::read_dir(self.outside())
            .expect("outside")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "nothing may be created outside: {names:?}");
    }
}

fn s(path: &Path) -> String {
    path.display().to_string()
}

#[tokio::test]
async fn not_configured_until_roots_are_set() {
    let h = unconfigured().await;
    let error = h
        .call("browse_directory", json!({}))
        .await
        .expect_err("not configured");
    match &error {
        ToolError::NotConfigured { domain, missing } => {
            assert_eq!(domain, "filesystem");
            assert_eq!(missing, &["filesystem_roots"]);
        }
        other => panic!("expected NotConfigured, got {other:?}"),
    }
    assert!(error.to_string().contains("filesystem_roots"));
    h.set_roots(&s(&h.root())).await;
    let listing = h.ok("browse_directory", json!({})).await;
    assert_eq!(listing["entries"][0]["name"], "docs");
}

#[tokio::test]
async fn malformed_roots_are_named() {
    let h = unconfigured().await;
    let file_root = s(&h.root().join("docs/notes.txt"));
    let cases = [
        ("[not json".to_owned(), "not a JSON array"),
        ("[1, 2]".to_owned(), "not a JSON array"),
        ("[]".to_owned(), "lists no directory"),
        ("[\"relative/dir\"]".to_owned(), "not an absolute path"),
        ("relative/dir".to_owned(), "not an absolute path"),
        (
            json!([h.dir.path().join("missing")]).to_string(),
            "cannot be opened",
        ),
        (json!([file_root]).to_string(), "not a directory"),
        (format!("{}:relative", s(&h.root())), "not an absolute path"),
    ];
    // Refused when set (issue 31), with the reason: the domain never looks active
    // with roots that cannot work.
    for (value, expected) in cases {
        let refused = h
            .ctx
            .settings()
            .set("filesystem_roots", &value)
            .await
            .expect_err(&value)
            .to_string();
        assert!(
            refused.contains("setting `filesystem_roots` is malformed")
                && refused.contains(expected),
            "{value}: {refused}"
        );
        assert_eq!(
            h.ctx
                .settings()
                .get("filesystem_roots")
                .await
                .expect("read"),
            None
        );
    }
    // A root that goes away after it was set is named when a tool runs.
    let gone = h.dir.path().join("gone");
    fs::create_dir_all(&gone).expect("mkdir");
    h.set_roots(&json!([gone]).to_string()).await;
    fs::remove_dir(&gone).expect("rmdir");
    let message = h.err("browse_directory", json!({})).await;
    assert!(
        message.contains("setting `filesystem_roots` is malformed")
            && message.contains("cannot be opened"),
        "{message}"
    );
    // Both accepted forms work, with several roots.
    h.set_roots(&format!("{}:{}", s(&h.root()), s(&h.root().join("docs"))))
        .await;
    let listing = h.ok("browse_directory", json!({})).await;
    assert_eq!(listing["roots"].as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn parent_components_are_refused() {
    let h = harness().await;
    for path in [
        "../outside/secret.txt",
        "docs/../../outside/secret.txt",
        "docs/..",
    ] {
        let message = h.err("read_file", json!({"path": path})).await;
        assert!(message.contains("contains `..`"), "{path}: {message}");
        let message = h
            .err(
                "write_file",
                json!({"path": path, "content": "pwned", "overwrite": true, "create_dirs": true}),
            )
            .await;
        assert!(message.contains("contains `..`"), "{path}: {message}");
    }
    let inside_then_out = s(&h.root().join("docs/../../outside/secret.txt"));
    let message = h.err("read_file", json!({"path": inside_then_out})).await;
    assert!(message.contains("contains `..`"), "{message}");
    h.secret_intact();
}

#[tokio::test]
async fn absolute_paths_outside_are_refused() {
    let h = harness().await;
    let secret = s(&h.outside().join("secret.txt"));
    let message = h.err("read_file", json!({"path": secret})).await;
    assert!(message.contains("outside the allowed roots"), "{message}");
    let message = h
        .err(
            "write_file",
            json!({"path": s(&h.outside().join("new.txt")), "content": "x"}),
        )
        .await;
    assert!(message.contains("outside the allowed roots"), "{message}");
    let message = h
        .err(
            "write_file",
            json!({"path": secret, "content": "x", "overwrite": true}),
        )
        .await;
    assert!(message.contains("outside the allowed roots"), "{message}");
    for tool in ["browse_directory", "file_info"] {
        let message = h.err(tool, json!({"path": "/etc"})).await;
        assert!(
            message.contains("outside the allowed roots"),
            "{tool}: {message}"
        );
    }
    // A sibling whose name merely starts with the root's name is outside too.
    let sibling = h.dir.path().join("root2");
    fs::create_dir_all(&sibling).expect("mkdir");
    let message = h
        .err("browse_directory", json!({"path": s(&sibling)}))
        .await;
    assert!(message.contains("outside the allowed roots"), "{message}");
    // Absolute inside the root is fine.
    let inside = h
        .ok(
            "read_file",
            json!({"path": s(&h.root().join("docs/notes.txt"))}),
        )
        .await;
    assert_eq!(inside["content"], "hello notes\n");
    h.secret_intact();
}

#[cfg(unix)]
#[tokio::test]
async fn symlinks_leading_out_are_refused() {
    use std::os::unix::fs::symlink;
    let h = harness().await;
    symlink(
        h.outside().join("secret.txt"),
        h.root().join("link-to-secret"),
    )
    .expect("symlink");
    symlink(h.outside(), h.root().join("link-to-outside")).expect("symlink");
    symlink(h.outside().join("not-yet.txt"), h.root().join("dangling")).expect("symlink");
    symlink(
        h.root().join("docs/notes.txt"),
        h.root().join("link-inside"),
    )
    .expect("symlink");

    for path in [
        "link-to-secret",
        "link-to-outside/secret.txt",
        "link-to-outside",
    ] {
        let message = h.err("read_file", json!({"path": path})).await;
        assert!(
            message.contains("outside the allowed roots"),
            "{path}: {message}"
        );
        let message = h.err("file_info", json!({"path": path})).await;
        assert!(
            message.contains("outside the allowed roots"),
            "{path}: {message}"
        );
    }
    let message = h
        .err("browse_directory", json!({"path": "link-to-outside"}))
        .await;
    assert!(message.contains("outside the allowed roots"), "{message}");

    for path in [
        "link-to-secret",
        "link-to-outside/secret.txt",
        "link-to-outside/new.txt",
        "link-to-outside/sub/new.txt",
    ] {
        let message = h
            .err(
                "write_file",
                json!({"path": path, "content": "pwned", "overwrite": true, "create_dirs": true}),
            )
            .await;
        assert!(
            message.contains("outside the allowed roots"),
            "{path}: {message}"
        );
    }
    // A dangling link would create its target on write: refused.
    let message = h
        .err(
            "write_file",
            json!({"path": "dangling", "content": "pwned", "overwrite": true}),
        )
        .await;
    assert!(message.contains("cannot be resolved"), "{message}");
    h.secret_intact();

    // find_files does not follow the link out.
    let found = h.ok("find_files", json!({"pattern": "secret*"})).await;
    assert_eq!(found["matches"], json!([]));

    // A link that stays inside the roots is fine.
    let inside = h.ok("read_file", json!({"path": "link-inside"})).await;
    assert_eq!(inside["content"], "hello notes\n");
    let info = h.ok("file_info", json!({"path": "link-inside"})).await;
    assert!(
        info["link_target"]
            .as_str()
            .is_some_and(|t| t.ends_with("docs/notes.txt"))
    );
}

#[tokio::test]
async fn browse_and_info() {
    let h = harness().await;
    let listing = h.ok("browse_directory", json!({})).await;
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["docs"]);
    let with_hidden = h
        .ok("browse_directory", json!({"include_hidden": true}))
        .await;
    assert_eq!(with_hidden["n_entries"], 2);

    let docs = h
        .ok("browse_directory", json!({"path": "docs", "limit": 2}))
        .await;
    assert_eq!(docs["entries"][0]["name"], "deep");
    assert_eq!(docs["entries"][0]["kind"], "directory");
    assert_eq!(docs["n_entries"], 3);
    assert_eq!(docs["truncated"], true);

    let info = h.ok("file_info", json!({"path": "docs/notes.txt"})).await;
    assert_eq!(info["kind"], "file");
    assert_eq!(info["size"], 12);
    assert!(info["modified"].as_str().is_some_and(|m| m.ends_with('Z')));
    let info = h.ok("file_info", json!({"path": "./docs"})).await;
    assert_eq!(info["kind"], "directory");
    assert_eq!(info["n_entries"], 3);

    let message = h.err("file_info", json!({"path": "docs/none.txt"})).await;
    assert!(message.contains("does not exist"), "{message}");
    let message = h
        .err("browse_directory", json!({"path": "docs/notes.txt"}))
        .await;
    assert!(message.contains("not a directory"), "{message}");
}

#[tokio::test]
async fn find_files_by_pattern_depth_and_count() {
    let h = harness().await;
    let found = h.ok("find_files", json!({"pattern": "*.txt"})).await;
    let paths: Vec<&str> = found["matches"]
        .as_array()
        .expect("matches")
        .iter()
        .filter_map(|m| m["path"].as_str())
        .collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(
        paths
            .iter()
            .any(|p| p.ends_with("docs/deep/deeper/plan.txt"))
    );

    let shallow = h
        .ok("find_files", json!({"pattern": "*.txt", "max_depth": 2}))
        .await;
    assert_eq!(shallow["matches"].as_array().map(Vec::len), Some(1));

    let pdf = h
        .ok("find_files", json!({"pattern": "report-??.pdf"}))
        .await;
    assert_eq!(pdf["matches"].as_array().map(Vec::len), Some(1));
    let exact = h
        .ok(
            "find_files",
            json!({"pattern": "report-??.pdf", "case_sensitive": true}),
        )
        .await;
    assert_eq!(exact["matches"], json!([]));

    let one = h
        .ok("find_files", json!({"pattern": "*", "max_results": 1}))
        .await;
    assert_eq!(one["matches"].as_array().map(Vec::len), Some(1));
    assert_eq!(one["truncated"], true);

    let by_path = h
        .ok("find_files", json!({"pattern": "docs/**/plan.txt"}))
        .await;
    assert_eq!(by_path["matches"].as_array().map(Vec::len), Some(1));

    let hidden = h
        .ok(
            "find_files",
            json!({"pattern": ".hidden*", "include_hidden": true}),
        )
        .await;
    assert_eq!(hidden["matches"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn read_text_binary_and_size_cap() {
    let h = harness().await;
    let binary = h
        .ok("read_file", json!({"path": "docs/Report-01.PDF"}))
        .await;
    assert_eq!(binary["binary"], true);
    assert!(binary.get("content").is_none());

    fs::write(h.root().join("big.txt"), "가".repeat(1000)).expect("write");
    let part = h
        .ok("read_file", json!({"path": "big.txt", "max_bytes": 100}))
        .await;
    // 3-byte characters: 33 whole ones fit in 100 bytes.
    assert_eq!(part["content"], "가".repeat(33));
    assert_eq!(part["truncated"], true);
    assert_eq!(part["next_offset"], 99);
    let rest = h
        .ok(
            "read_file",
            json!({"path": "big.txt", "offset": 99, "max_bytes": 10000}),
        )
        .await;
    assert_eq!(rest["content"], "가".repeat(967));
    assert_eq!(rest["truncated"], false);

    let big = vec![b'a'; 1024 * 1024 + 10];
    fs::write(h.root().join("huge.txt"), big).expect("write");
    let capped = h.ok("read_file", json!({"path": "huge.txt"})).await;
    assert_eq!(capped["n_bytes_read"], 1024 * 1024);
    assert_eq!(capped["truncated"], true);
    assert_eq!(capped["size"], 1024 * 1024 + 10);

    let message = h.err("read_file", json!({"path": "docs"})).await;
    assert!(message.contains("is a directory"), "{message}");
}

#[tokio::test]
async fn write_create_overwrite_and_dirs() {
    let h = harness().await;
    let written = h
        .ok(
            "write_file",
            json!({"path": "out/today.md", "content": "# Today", "create_dirs": true}),
        )
        .await;
    assert_eq!(written["created"], true);
    assert_eq!(
        fs::read_to_string(h.root().join("out/today.md")).expect("read"),
        "# Today"
    );

    let message = h
        .err(
            "write_file",
            json!({"path": "out/today.md", "content": "again"}),
        )
        .await;
    assert!(message.contains("overwrite: true"), "{message}");
    let replaced = h
        .ok(
            "write_file",
            json!({"path": "out/today.md", "content": "again", "overwrite": true}),
        )
        .await;
    assert_eq!(replaced["created"], false);
    assert_eq!(
        fs::read_to_string(h.root().join("out/today.md")).expect("read"),
        "again"
    );

    let message = h
        .err(
            "write_file",
            json!({"path": "new/dir/x.txt", "content": "x"}),
        )
        .await;
    assert!(message.contains("create_dirs: true"), "{message}");
    assert!(!h.root().join("new").exists());

    let message = h
        .err(
            "write_file",
            json!({"path": "docs", "content": "x", "overwrite": true}),
        )
        .await;
    assert!(message.contains("is a directory"), "{message}");

    let absolute = s(&h.root().join("abs.txt"));
    h.ok("write_file", json!({"path": absolute, "content": "ok"}))
        .await;
    assert!(h.root().join("abs.txt").exists());
}

/// Issue 31, defect 2: a FIFO inside the roots blocked `read_file` and `write_file`
/// forever (and with them stdio `loadout mcp`). They now refuse it without opening
/// it, and so a Unix socket.
#[tokio::test]
async fn fifos_and_sockets_are_refused_without_blocking() {
    let h = harness().await;
    let fifo = h.root().join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let socket = h.root().join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    for (path, kind) in [(&fifo, "named pipe"), (&socket, "socket")] {
        let calls = [
            ("read_file", json!({"path": s(path)})),
            (
                "write_file",
                json!({"path": s(path), "content": "x", "overwrite": true}),
            ),
        ];
        for (tool, args) in calls {
            let answer =
                tokio::time::timeout(std::time::Duration::from_secs(10), h.call(tool, args))
                    .await
                    .unwrap_or_else(|_| panic!("{tool} on a {kind} blocked"));
            let message = answer.expect_err(tool).to_string();
            assert!(
                message.contains(kind) && message.contains("regular files"),
                "{tool}: {message}"
            );
        }
    }
    // Details are still given.
    let info = h.ok("file_info", json!({"path": s(&fifo)})).await;
    assert_eq!(info["kind"], "other");
}

/// Issue 36: `write_file` created names with a newline or U+202E (which shows
/// `invoice\u{202E}fdp.exe` as `invoiceexe.pdf`).
#[tokio::test]
async fn write_file_refuses_control_and_bidi_characters_in_names() {
    let h = harness().await;
    for path in [
        "evil\nname.txt",
        "tab\there.txt",
        "nul\u{0}.txt",
        "bell\u{7}.txt",
        "invoice\u{202E}fdp.exe",
        "left\u{202A}.txt",
        "isolate\u{2066}x\u{2069}.txt",
        "dir\u{202D}/x.txt",
    ] {
        let message = h
            .err(
                "write_file",
                json!({"path": path, "content": "x", "create_dirs": true}),
            )
            .await;
        assert!(
            message.contains("control or text-direction"),
            "{path:?}: {message}"
        );
    }
    let names: Vec<String> = fs::read_dir(h.root())
        .expect("list root")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n
            .chars()
            .all(|c| !c.is_control() && !('\u{202A}'..='\u{2069}').contains(&c))),
        "{names:?}"
    );
    // Other non-ASCII names are fine.
    h.ok(
        "write_file",
        json!({"path": "메모 – ok.txt", "content": "x"}),
    )
    .await;
}
