//! The `loadout` binary as a user runs it.

use std::process::Command;

use crate::support::domain_decision;
use serde_json::Value;

fn loadout(data_dir: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_loadout"));
    command
        .env("LOADOUT_DATA_DIR", data_dir)
        .env_remove("LOADOUT_DATABASE_URL");
    command
}

/// The standard output of a run that must succeed (its stderr shown if not).
fn stdout_of(output: std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `calculate` is defined only in the `core` domain crate; nothing in the binary
/// names it, yet it is in the binary's registry.
#[test]
fn a_tool_defined_only_in_a_domain_crate_is_in_the_binary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = loadout(dir.path())
        .args(["tools", "--json"])
        .output()
        .expect("run loadout");
    let listing: serde_json::Value = serde_json::from_str(&stdout_of(output)).expect("json");
    let tools: Vec<&str> = listing["domains"]
        .as_array()
        .expect("domains")
        .iter()
        .flat_map(|d| d["tools"].as_array().into_iter().flatten())
        .filter_map(|t| t["name"].as_str())
        .collect();
    for name in ["calculate", "query_data", "recall", "read_file"] {
        assert!(tools.contains(&name), "{name} missing from {tools:?}");
    }
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/main.rs"))
        .expect("main.rs");
    assert!(!source.contains("calculate"));
}

#[test]
fn call_validates_and_reports_errors_with_exit_code_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = loadout(dir.path())
        .args(["call", "calculate", "--args", r#"{"expression": 12}"#])
        .output()
        .expect("run loadout");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`expression`"), "{stderr}");

    let output = loadout(dir.path())
        .args(["call", "calculate", "--args", "{not json"])
        .output()
        .expect("run");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("not valid JSON"));
}

#[test]
fn settings_persist_across_processes_and_secrets_are_masked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let set = loadout(dir.path())
        .args(["settings", "set", "llm_api_key", "sk-verysecretvalue"])
        .output()
        .expect("run");
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let get = loadout(dir.path())
        .args(["settings", "get", "llm_api_key"])
        .output()
        .expect("run");
    let shown = String::from_utf8_lossy(&get.stdout);
    assert!(
        shown.contains("********") && !shown.contains("verysecret"),
        "{shown}"
    );
    let bad = loadout(dir.path())
        .args(["settings", "set", "Bad Key", "x"])
        .output()
        .expect("run");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("setting key"));
}

/// `serve` on an address beyond loopback without `LOADOUT_TOKEN` makes a token,
/// prints it once, and requires it; a token too short to be safe stops the binary.
#[test]
fn serving_beyond_loopback_requires_a_bearer_token() {
    use std::io::{BufRead, BufReader, Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let output = loadout(dir.path())
        .args(["serve", "--addr", "0.0.0.0:0"])
        .env("LOADOUT_TOKEN", "short")
        .output()
        .expect("run loadout");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("at least 16 characters"), "{stderr}");

    let mut child = loadout(dir.path())
        .args(["serve", "--addr", "0.0.0.0:0"])
        .env_remove("LOADOUT_TOKEN")
        .env("LOADOUT_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn loadout serve");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let server = Kill(child);
    let (mut token, mut port) = (None, None);
    for line in lines.by_ref().map_while(Result::ok) {
        if let Some(rest) = line.split("bearer token (shown once): ").nth(1) {
            token = Some(rest.trim().to_owned());
        }
        if let Some(rest) = line.split("serving on http://").nth(1) {
            port = rest
                .split_whitespace()
                .next()
                .and_then(|addr| addr.rsplit(':').next())
                .map(str::to_owned);
            break;
        }
    }
    let token = token.expect("a generated token is printed");
    assert!(token.len() >= 32, "{token}");
    let port = port.expect("the address is printed");
    let get = |authorization: Option<&str>| {
        let mut stream =
            std::net::TcpStream::connect(format!("127.0.0.1:{port}")).expect("connect");
        let header = authorization
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "GET /api/domains HTTP/1.1\r\nHost: localhost\r\n{header}Connection: close\r\n\r\n"
        )
        .expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        response
    };
    assert!(get(None).starts_with("HTTP/1.1 401"), "{}", get(None));
    assert!(get(Some("wrong-token-of-enough-length")).starts_with("HTTP/1.1 401"));
    let ok = get(Some(&token));
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    // Shown once: nothing else on stderr repeats it.
    drop(server);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(!rest.iter().any(|l| l.contains(&token)), "{rest:?}");
}

/// Each domain's reason in the selection `loadout route --json` printed.
fn domain_reasons(output: std::process::Output) -> Vec<String> {
    let selection: serde_json::Value = serde_json::from_str(&stdout_of(output)).expect("json");
    selection["domains"]
        .as_array()
        .expect("domains")
        .iter()
        .filter_map(|d| d["reason"].as_str().map(str::to_owned))
        .collect()
}

/// `loadout route` routes with the same stages as `loadout serve`: the dense stage
/// too (its vectors cached in the data dir), unless `--lexical`.
#[test]
fn route_uses_the_dense_stage_unless_asked_not_to() {
    if !loadout_embed::builtin_available() {
        eprintln!("note: built without the dense feature; skipped");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let reasons = |extra: &[&str]| -> String {
        let output = loadout(dir.path())
            .args(["route", "what is my parrot called?", "--json"])
            .args(extra)
            .output()
            .expect("run loadout");
        domain_reasons(output).join(" | ")
    };
    let dense = reasons(&[]);
    assert!(dense.contains("dense"), "{dense}");
    assert!(
        dir.path().join("vectors").is_dir(),
        "the vectors are cached"
    );
    let lexical = reasons(&["--lexical"]);
    assert!(!lexical.contains("dense"), "{lexical}");
}

/// `router_e5_model = FILE` joins multilingual-e5-small to the built-in encoder: a
/// message in Hangul, which the built-in encoder cannot read, is sent tools on the
/// second encoder's features (the shipped joined model weighs them), and both the
/// joined vectors and the built-in's (its fallback when busy) are cached. A file that
/// is no model leaves the built-in encoder alone, with a warning.
#[test]
fn router_e5_model_joins_e5_to_the_built_in_encoder() {
    let Some(model) = std::env::var_os("LOADOUT_E5_MODEL") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI downloads e5's model file (LOADOUT_E5_MODEL)"
        );
        eprintln!("note: LOADOUT_E5_MODEL unset; skipped");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let set = |file: &std::ffi::OsStr| {
        let output = loadout(dir.path())
            .args(["settings", "set", "router_e5_model"])
            .arg(file)
            .output()
            .expect("run loadout");
        stdout_of(output);
    };
    let route = || -> serde_json::Value {
        let output = loadout(dir.path())
            .args(["route", "치과 예약이 언제였지?", "--json"])
            .output()
            .expect("run loadout");
        serde_json::from_str(&stdout_of(output)).expect("json")
    };
    set(&model);
    let selection = route();
    let on_e5: Vec<&str> = selection["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter(|t| {
            t["why"]
                .as_object()
                .is_some_and(|why| why.keys().any(|k| k.starts_with("tool_dense2")))
        })
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(on_e5.contains(&"list_memories"), "{selection}");
    let caches = std::fs::read_dir(dir.path().join("vectors"))
        .expect("vectors")
        .count();
    assert_eq!(caches, 2, "the joined and the built-in's vectors");

    let not_a_model = dir.path().join("not-a-model.bin");
    std::fs::write(&not_a_model, b"not a model").expect("written");
    set(not_a_model.as_os_str());
    let selection = route();
    let text = selection.to_string();
    assert!(
        text.contains("tool_dense_") && !text.contains("tool_dense2"),
        "{text}"
    );
}

/// `router_dense = static` routes with the table distilled from the built-in encoder,
/// read from the data dir (distilled there at first start; here, a table of a few
/// hundred common tokens written beforehand, so that the test does not distil for
/// minutes): the tool vectors are the static model's, and the table is not rewritten.
#[test]
fn route_with_router_dense_static_uses_the_distilled_table_of_the_data_dir() {
    if !loadout_embed::builtin_available() {
        eprintln!("note: built without the dense feature; skipped");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let source = loadout_embed::builtin().expect("built-in encoder");
    let common: Vec<u32> = (1996..2300).collect();
    let table =
        loadout_embed::static_table::StaticEncoder::distill(source.as_ref(), 2, Some(&common))
            .expect("distilled");
    let model_id = loadout_embed::Embedder::model_id(&table).to_owned();
    let vectors = dir.path().join("vectors");
    let table_file = loadout_embed::static_table::table_path(&vectors, &model_id);
    table.write(&table_file).expect("written");
    let written = std::fs::read(&table_file).expect("read");
    let set = loadout(dir.path())
        .args(["settings", "set", "router_dense", "static"])
        .output()
        .expect("run loadout");
    stdout_of(set);
    let output = loadout(dir.path())
        .args(["route", "what is my parrot called?", "--json"])
        .output()
        .expect("run loadout");
    let reasons = domain_reasons(output);
    assert!(reasons.iter().any(|r| r.contains("dense")), "{reasons:?}");
    let cache = loadout_embed::VectorCache::open(&vectors, &model_id);
    assert!(!cache.is_empty(), "tool vectors cached under {model_id}");
    assert_eq!(std::fs::read(&table_file).expect("read"), written);
}

/// Issue 37: "delete all my notes" is about memory; the scratchpad's `drop_table`
/// stays out however close its text comes, on both paths.
#[test]
fn a_destructive_tool_of_a_domain_the_message_is_not_about_stays_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    for extra in [&[][..], &["--lexical"][..]] {
        let output = loadout(dir.path())
            .args(["route", "delete all my notes", "--json"])
            .args(extra)
            .output()
            .expect("run loadout");
        let selection: serde_json::Value = serde_json::from_str(&stdout_of(output)).expect("json");
        let sent: Vec<&str> = selection["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert!(sent.contains(&"forget"), "{extra:?}: {sent:?}");
        assert!(!sent.contains(&"drop_table"), "{extra:?}: {sent:?}");
    }
}

/// A key no domain declares is refused by name, not routed as if nothing were set.
#[test]
fn route_refuses_a_configured_key_no_domain_declares() {
    let dir = tempfile::tempdir().expect("tempdir");
    let route = |configured: &str| {
        loadout(dir.path())
            .args(["route", "list my files", "--lexical", "--configured"])
            .arg(configured)
            .output()
            .expect("run loadout")
    };
    let output = route("filesystem_roots,filesytem_root");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`filesytem_root`"), "{stderr}");
    assert!(!stderr.contains("`filesystem_roots`"), "{stderr}");
    assert!(stderr.contains("filesystem_roots"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    assert!(stdout_of(route("filesystem_roots")).contains("filesystem"));
}

/// `[router]` in the data dir's `loadout.toml` tunes what `route` (and `serve`)
/// sends; a bad key stops the command with the key named.
#[test]
fn route_takes_the_router_tunables_of_the_config_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let route = |extra: &[&str]| {
        loadout(dir.path())
            .args(["route", "list my files", "--lexical", "--json"])
            .args(["--configured", "filesystem_roots"])
            .args(extra)
            .output()
            .expect("run loadout")
    };
    let selection = |output: std::process::Output| -> serde_json::Value {
        serde_json::from_str(&stdout_of(output)).expect("selection JSON")
    };
    let filesystem_tools = |selection: &serde_json::Value| {
        selection["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .filter(|t| t["domain"] == "filesystem")
            .count()
    };
    let hints = |selection: &serde_json::Value| selection["hints"].as_array().map_or(0, Vec::len);
    let defaults = selection(route(&[]));
    assert_eq!(defaults["token_budget"], 4000);
    assert!(filesystem_tools(&defaults) > 2, "{defaults}");
    assert!(hints(&defaults) > 2, "{defaults}");

    std::fs::write(
        dir.path().join("loadout.toml"),
        "[router]\ntoken_budget = 3210\nmax_hints = 2\n",
    )
    .expect("write config");
    let tuned = selection(route(&[]));
    assert_eq!(tuned["token_budget"], 3210);
    assert_eq!(hints(&tuned), 2, "{tuned}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[router]\ntoken_budjet = 3000\n").expect("write config");
    let output = route(&["--config", &bad.display().to_string()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("token_budjet") && stderr.contains("bad.toml"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Routes each message of `session` through `/api/route`, reporting the calls given
/// with it (those of the turn before, as a client running its own model does).
async fn route_turns(app: &axum::Router, session: &str, turns: &[(&str, &[&str])]) {
    for (message, called) in turns {
        let (status, body) = crate::support::send(
            app,
            "POST",
            "/api/route",
            Some(serde_json::json!({"session": session, "message": message, "called": called})),
        )
        .await;
        assert!(status.is_success(), "{body}");
    }
}

/// Turns routed through `/api/route`, with the calls the client reported, replay from
/// the store: a turn whose called tool was routed is a hit, one whose tool was not
/// is a miss with its reasons, each session routes with the domains active when it
/// ran, and `--export` writes them as eval cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_measures_stored_sessions_against_the_tools_their_model_called() {
    use serde_json::json;
    let (dir, app) = crate::support::http_app(None).await;
    route_turns(
        &app,
        "s1",
        &[
            ("remember that my sister is called Ana", &[]),
            ("hello there", &["remember"]),
            ("ok", &["list_tables"]),
        ],
    )
    .await;
    // Filesystem was configured while s2 ran, and is not any more: s2 replays with
    // the domains active then, as its logged decisions say.
    let files = tempfile::tempdir().expect("tempdir");
    let roots = json!([files.path().display().to_string()]).to_string();
    let (status, _) = crate::support::send(
        &app,
        "PUT",
        "/api/settings/filesystem_roots",
        Some(json!({"value": roots})),
    )
    .await;
    assert!(status.is_success());
    route_turns(
        &app,
        "s2",
        &[("read the notes file", &[]), ("thanks", &["read_file"])],
    )
    .await;
    assert_eq!(
        crate::support::logged_selections(&app, "s1", 3).await.len(),
        3
    );
    assert_eq!(
        crate::support::logged_selections(&app, "s2", 2).await.len(),
        2
    );
    let (status, _) =
        crate::support::send(&app, "DELETE", "/api/settings/filesystem_roots", None).await;
    assert!(status.is_success());

    let (_, session) = crate::support::send(&app, "GET", "/api/sessions/s1", None).await;
    let reported: Vec<(&Value, &Value)> = session["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| (&m["turn"], &m["content"]["name"]))
        .collect();
    assert_eq!(
        reported,
        [
            (&json!(1), &json!("remember")),
            (&json!(2), &json!("list_tables"))
        ],
        "{session}"
    );
    let calls: Vec<(&Value, &Value, &Value)> = session["tool_calls"]
        .as_array()
        .expect("tool calls")
        .iter()
        .map(|c| (&c["turn"], &c["name"], &c["reported"]))
        .collect();
    assert_eq!(
        calls,
        [
            (&json!(1), &json!("remember"), &json!(true)),
            (&json!(2), &json!("list_tables"), &json!(true))
        ],
        "{session}"
    );
    drop(app);
    // A call of a tool the registry no longer has (or an upstream server's) is left
    // out, and said so.
    let store = loadout_store::Store::open_dir(dir.path())
        .await
        .expect("store");
    store
        .message_append("s1", "tool", &json!({"name": "gone_tool", "ok": true}))
        .await
        .expect("append");

    let run = |args: &[&str]| {
        stdout_of(
            loadout(dir.path())
                .arg("replay")
                .args(args)
                .output()
                .expect("run loadout"),
        )
    };
    let out = run(&["--lexical", "--json"]);
    let figures: Value =
        serde_json::from_str(out.lines().last().expect("a last line")).expect("JSON figures");
    // s2's read_file counts as routed: filesystem was active when s2 ran.
    assert_eq!(figures["turns"], 5, "{out}");
    assert_eq!(figures["hits"], 4, "{out}");
    assert!(
        out.contains("MISS s1 turn 2: \"hello there\"")
            && out.contains("list_tables: domain scratchpad excluded"),
        "{out}"
    );

    let output = loadout(dir.path())
        .args(["replay", "--export", "-"])
        .output()
        .expect("run loadout");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("1 calls of tools this registry lacks"),
        "{stderr}"
    );
    let exported = String::from_utf8_lossy(&output.stdout).into_owned();
    let cases: Vec<Value> = exported
        .lines()
        .map(|line| serde_json::from_str(line).expect("a case"))
        .collect();
    // Most recently active first: s1 got the last message.
    let [case, later] = &cases[..] else {
        panic!("two sessions expected: {exported}");
    };
    assert_eq!(later["id"], "s2");
    assert_eq!(later["turns"][0]["needed"], json!(["read_file"]), "{later}");
    assert!(
        later["configured"]
            .as_array()
            .expect("keys")
            .contains(&json!("filesystem_roots")),
        "{later}"
    );
    assert_eq!(case["id"], "s1");
    assert_eq!(case["turns"][0]["needed"], json!(["remember"]), "{case}");
    assert_eq!(case["turns"][1]["needed"], json!(["list_tables"]), "{case}");
    assert_eq!(case["turns"][2]["needed"], json!([]), "{case}");

    // The exported cases replay the same.
    let file = dir.path().join("cases.jsonl");
    std::fs::write(&file, &exported).expect("write");
    let again = run(&[
        "--lexical",
        "--json",
        "--cases",
        &file.display().to_string(),
    ]);
    let figures: Value =
        serde_json::from_str(again.lines().last().expect("a last line")).expect("JSON figures");
    assert_eq!(
        (figures["turns"].clone(), figures["hits"].clone()),
        (json!(5), json!(4))
    );

    // A candidate config replayed beside the one in force: a budget too small for
    // s1's memory tools breaks the turn that needed `remember`.
    let candidate = dir.path().join("candidate.toml");
    std::fs::write(&candidate, "[router]\ntoken_budget = 1\n").expect("write");
    let compared = run(&[
        "--lexical",
        "--json",
        "--compare",
        &candidate.display().to_string(),
    ]);
    assert!(
        compared.contains("token_budget: 4000 → 1")
            && compared.contains("NOW MISSED s1 turn 1: \"remember that my sister is called Ana\""),
        "{compared}"
    );
    let figures: Value =
        serde_json::from_str(compared.lines().last().expect("a last line")).expect("JSON");
    assert_eq!(figures["baseline"]["hits"], 4, "{figures}");
    assert_eq!(
        figures["now_missed"][0]["tools"],
        json!(["remember"]),
        "{figures}"
    );
    assert_eq!(
        figures["candidate"]["hits"].as_i64(),
        Some(
            4 - figures["now_missed"]
                .as_array()
                .map_or(0, |m| m.len() as i64)
                + figures["now_hit"].as_array().map_or(0, |h| h.len() as i64)
        ),
        "{figures}"
    );
    let output = loadout(dir.path())
        .args(["replay", "--compare", "missing.toml"])
        .output()
        .expect("run loadout");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("missing.toml"));

    let output = loadout(dir.path())
        .args(["replay", "--session", "nobody"])
        .output()
        .expect("run loadout");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("no session `nobody`"));
}

/// `route` and `replay` connect the upstream MCP servers of `loadout.toml` as
/// `serve` does, so their tools route and their calls count; `--no-upstream` leaves
/// them out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_and_replay_route_the_upstream_servers_tools_as_serve_does() {
    let Some(dir) = crate::support::data_dir_with_fake_upstream() else {
        return;
    };
    let route = |extra: &[&str]| -> Value {
        let out = stdout_of(
            loadout(dir.path())
                .args(["route", "echo this back to me", "--lexical", "--json"])
                .args(extra)
                .output()
                .expect("run loadout"),
        );
        serde_json::from_str(&out).expect("selection JSON")
    };
    let sends_echo = |selection: &Value| {
        selection["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .any(|t| t["name"] == "fake__echo")
    };
    let connected = route(&[]);
    assert!(sends_echo(&connected), "{connected}");
    let alone = route(&["--no-upstream"]);
    assert!(!sends_echo(&alone), "{alone}");

    // A stored session whose model called the upstream tool.
    let store = loadout_store::Store::open_dir(dir.path())
        .await
        .expect("store");
    store
        .message_append("u1", "user", &Value::from("echo this back to me"))
        .await
        .expect("append");
    store
        .message_append(
            "u1",
            "tool",
            &serde_json::json!({"name": "fake__echo", "ok": true}),
        )
        .await
        .expect("append");
    drop(store);
    let replay = |extra: &[&str]| {
        let output = loadout(dir.path())
            .args(["replay", "--lexical", "--json"])
            .args(extra)
            .output()
            .expect("run loadout");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let out = stdout_of(output);
        let figures: Value =
            serde_json::from_str(out.lines().last().expect("a last line")).expect("figures");
        (figures, stderr)
    };
    let (figures, stderr) = replay(&[]);
    assert_eq!(
        (&figures["turns"], &figures["hits"]),
        (&1.into(), &1.into()),
        "{figures}"
    );
    assert!(!stderr.contains("lacks"), "{stderr}");
    let (_, stderr) = replay(&["--no-upstream"]);
    assert!(
        stderr.contains("1 calls of tools this registry lacks"),
        "{stderr}"
    );
    // The turn needed the upstream tool only while its server is connected.
    let needed = |extra: &[&str]| -> Value {
        let out = stdout_of(
            loadout(dir.path())
                .args(["replay", "--export", "-"])
                .args(extra)
                .output()
                .expect("run loadout"),
        );
        let case: Value = serde_json::from_str(out.lines().next().expect("a case")).expect("case");
        case["turns"][0]["needed"].clone()
    };
    assert_eq!(needed(&[]), serde_json::json!(["fake__echo"]));
    assert_eq!(needed(&["--no-upstream"]), serde_json::json!([]));
}

/// `loadout decisions` prints the decision log's newest rows with their reasons as
/// JSON (SQLite stores them compact), all of them or one session's.
#[test]
fn decisions_prints_the_logged_rows_with_their_reasons() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (message, session) in [
        ("list my files", Some("s1")),
        ("what time is it", None),
        ("read the file notes.txt", Some("s1")),
    ] {
        let mut route = loadout(dir.path());
        route.args([
            "route",
            message,
            "--lexical",
            "--configured",
            "filesystem_roots",
        ]);
        if let Some(session) = session {
            route.args(["--session", session]);
        }
        stdout_of(route.output().expect("run loadout"));
    }
    let rows = |args: &[&str]| -> Vec<serde_json::Value> {
        let out = stdout_of(
            loadout(dir.path())
                .args(["decisions", "--json"])
                .args(args)
                .output()
                .expect("run loadout"),
        );
        out.lines()
            .map(|line| serde_json::from_str(line).expect("a JSON row"))
            .collect()
    };
    let all = rows(&[]);
    let messages: Vec<&str> = all.iter().filter_map(|r| r["message"].as_str()).collect();
    assert_eq!(
        messages,
        [
            "list my files",
            "what time is it",
            "read the file notes.txt"
        ]
    );
    for row in &all {
        let tools = row["reasons"]["tools"].as_array().expect("reasons as JSON");
        assert!(tools.iter().any(|t| t == "current_time"), "{row}");
        assert_eq!(
            tools.len() as i64,
            row["n_tools"].as_i64().unwrap_or(-1),
            "{row}"
        );
    }
    assert!(
        all[0]["reasons"]["domains"]
            .as_array()
            .expect("domains")
            .iter()
            .any(|d| d["domain"] == "filesystem" && d["included"] == true),
        "{}",
        all[0]
    );
    let last = rows(&["--tail", "1"]);
    assert_eq!(last.len(), 1);
    assert_eq!(last[0]["message"], "read the file notes.txt");
    let session = rows(&["--session", "s1"]);
    assert_eq!(session.len(), 2);
    assert!(session.iter().all(|r| r["session"] == "s1"));
    let text = stdout_of(
        loadout(dir.path())
            .args(["decisions", "--tail", "1"])
            .output()
            .expect("run loadout"),
    );
    assert!(
        text.contains("\"read the file notes.txt\"") && text.contains("\"tools\":["),
        "{text}"
    );
    // Issue 40: times as `loadout audit` prints them, not epoch milliseconds.
    assert!(
        text.split(' ').next().is_some_and(is_iso_utc_millis),
        "{text}"
    );
}

/// `2026-11-26T23:41:07.123Z`: ISO 8601 UTC with milliseconds.
fn is_iso_utc_millis(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 24
        && bytes.iter().enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            10 => *b == b'T',
            13 | 16 => *b == b':',
            19 => *b == b'.',
            23 => *b == b'Z',
            _ => b.is_ascii_digit(),
        })
}

/// Issue 32: `loadout call` was never audited, audit times were epoch milliseconds,
/// and a setting's name was masked as if it were the secret (`********oots`).
#[test]
fn call_is_audited_with_iso_times_and_only_secret_values_masked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let call = |tool: &str, args: &str| {
        loadout(dir.path())
            .args(["call", tool, "--args", args])
            .output()
            .expect("run loadout")
    };
    assert!(
        call("calculate", r#"{"expression": "2+3"}"#)
            .status
            .success()
    );
    assert_eq!(
        call("calculate", r#"{"expression": 12}"#).status.code(),
        Some(2)
    );
    // An operator key: the model's tool refuses it, and the refusal is audited too.
    call(
        "set_setting",
        r#"{"key": "filesystem_roots", "value": "/srv/data"}"#,
    );
    assert!(
        call(
            "set_setting",
            r#"{"key": "llm_api_key", "value": "sk-123456789abcdef"}"#
        )
        .status
        .success()
    );
    let out = stdout_of(
        loadout(dir.path())
            .args(["audit", "--json"])
            .output()
            .expect("run loadout"),
    );
    let rows: Vec<Value> = out
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON row"))
        .collect();
    let tools: Vec<&str> = rows.iter().filter_map(|r| r["tool"].as_str()).collect();
    assert_eq!(
        tools,
        ["calculate", "calculate", "set_setting", "set_setting"],
        "{out}"
    );
    for row in &rows {
        assert_eq!(row["client"], "cli", "{row}");
        let at = row["at"].as_str().unwrap_or_default();
        assert!(is_iso_utc_millis(at), "{row}");
        assert!(row.get("at_ms").is_none(), "{row}");
    }
    assert_eq!(rows[0]["outcome"], "ok");
    assert_eq!(rows[0]["args"], serde_json::json!({"expression": "2+3"}));
    assert_eq!(rows[1]["outcome"], "invalid_args", "{}", rows[1]);
    assert_eq!(rows[2]["args"]["key"], "filesystem_roots", "{}", rows[2]);
    assert_eq!(rows[2]["args"]["value"], "/srv/data", "{}", rows[2]);
    assert_eq!(rows[3]["args"]["key"], "llm_api_key", "{}", rows[3]);
    assert_eq!(rows[3]["args"]["value"], "********cdef", "{}", rows[3]);
    assert!(!out.contains("123456789"), "{out}");

    let text = stdout_of(
        loadout(dir.path())
            .args(["audit", "--tail", "1"])
            .output()
            .expect("run loadout"),
    );
    let first = text.split_whitespace().next().unwrap_or_default();
    assert!(is_iso_utc_millis(first), "{text}");
    assert!(
        text.contains("llm_api_key") && !text.contains("123456789"),
        "{text}"
    );
}

/// Issue 32: `loadout tools` ignored `[servers]`; an upstream server's stderr reached
/// the terminal of `loadout route`; log lines carried colour codes into pipes.
#[test]
fn tools_lists_upstream_servers_and_their_stderr_stays_in_the_log() {
    let Some(dir) = crate::support::data_dir_with_fake_upstream() else {
        return;
    };
    let names = |extra: &[&str]| -> Vec<String> {
        let out = stdout_of(
            loadout(dir.path())
                .args(["tools", "--json"])
                .args(extra)
                .output()
                .expect("run loadout"),
        );
        let listing: Value = serde_json::from_str(&out).expect("json");
        listing["domains"]
            .as_array()
            .expect("domains")
            .iter()
            .flat_map(|d| d["tools"].as_array().into_iter().flatten())
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect()
    };
    let with = names(&[]);
    assert!(with.iter().any(|n| n == "fake__echo"), "{with:?}");
    assert!(with.iter().any(|n| n == "calculate"), "{with:?}");
    let without = names(&["--no-upstream"]);
    assert!(!without.iter().any(|n| n == "fake__echo"), "{without:?}");
    let table = stdout_of(
        loadout(dir.path())
            .arg("tools")
            .output()
            .expect("run loadout"),
    );
    assert!(
        table.contains("mcp_fake") && table.contains("fake__echo"),
        "{table}"
    );

    // The fake server writes a line to its stderr at every start.
    let banner = "fake-upstream: serving on stdio";
    for args in [
        &["route", "echo this back to me", "--lexical"][..],
        &["tools"][..],
    ] {
        let output = loadout(dir.path())
            .args(args)
            .env("LOADOUT_LOG", "info")
            .output()
            .expect("run loadout");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert!(
            !stdout.contains(banner) && !stderr.contains(banner),
            "{args:?}: {stdout}\n{stderr}"
        );
        assert!(
            !stderr.contains('\u{1b}'),
            "{args:?}: colour codes in a pipe: {stderr:?}"
        );
    }
    // In the log at debug level.
    let output = loadout(dir.path())
        .args(["route", "echo this back to me", "--lexical"])
        .env("LOADOUT_LOG", "loadout_server=debug")
        .output()
        .expect("run loadout");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("upstream `fake` stderr: fake-upstream: serving on stdio"),
        "{stderr}"
    );
}

/// Issue 29: `loadout learn --cases` imports labeled turns (tools no tool has are
/// left out, with a warning); `loadout learned` says what was learned and from what;
/// `--forget TOOL` and `--forget-all` take it back; with `learning = off` nothing is
/// imported.
#[test]
fn learn_imports_labeled_turns_and_learned_lists_and_forgets_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = dir.path().join("cases.jsonl");
    let lines = [
        serde_json::json!({"id": "a", "configured": "all", "turns": [
            {"user": "remember to zorblax the quarterly ledgers", "needed": ["list_tables"]},
            {"user": "and what is 17 times 3", "needed": ["calculate"], "called": ["calculate"]},
            {"user": "thanks", "needed": []},
        ]}),
        serde_json::json!({"id": "b", "configured": [], "turns": [
            {"user": "frob the widgets", "needed": ["no_such_tool"]},
        ]}),
    ];
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&cases, text.join("\n")).expect("write cases");
    let run = |args: &[&str]| {
        loadout(dir.path())
            .args(args)
            .output()
            .expect("run loadout")
    };
    let cases_arg = cases.to_str().expect("utf-8 path");

    assert!(stdout_of(run(&["learned"])).contains("nothing learned yet"));
    let imported = run(&["learn", "--cases", cases_arg]);
    let stderr = String::from_utf8_lossy(&imported.stderr).into_owned();
    let stdout = stdout_of(imported);
    assert!(stdout.contains("learned 2 turns"), "{stdout}");
    assert!(stderr.contains("no_such_tool"), "{stderr}");

    let listed = stdout_of(run(&["learned", "--json"]));
    let tools: Vec<Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["tool"].as_str()).collect();
    assert_eq!(names, ["calculate", "list_tables"], "{listed}");
    assert_eq!(tools[1]["sources"]["import"], 1, "{listed}");
    assert_eq!(
        tools[1]["example"],
        "remember to zorblax the quarterly ledgers"
    );

    let one = stdout_of(run(&["learned", "--tool", "list_tables"]));
    assert!(
        one.contains("remember to zorblax the quarterly ledgers") && one.contains("import"),
        "{one}"
    );
    // Issue 40: the newest entry's time and each entry's, in ISO 8601 UTC.
    let newest = one
        .split("newest ")
        .nth(1)
        .map(|rest| rest.get(..24).unwrap_or(rest));
    assert!(newest.is_some_and(is_iso_utc_millis), "{one}");
    let entry = one.lines().nth(1).and_then(|l| l.split_whitespace().next());
    assert!(entry.is_some_and(is_iso_utc_millis), "{one}");
    // Imported twice, a turn merges into its entry instead of being added again.
    let again = stdout_of(run(&["learn", "--cases", cases_arg]));
    assert!(
        again.contains("learned 0 turns") && again.contains("2 merged"),
        "{again}"
    );

    // `loadout route` routes with what was learned, as the server does.
    let routed = stdout_of(run(&[
        "route",
        "remember to zorblax the monthly ledgers",
        "--lexical",
        "--json",
    ]));
    let selection: Value = serde_json::from_str(&routed).expect("selection JSON");
    assert!(
        selection["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["name"] == "list_tables"),
        "{routed}"
    );
    let scratchpad = domain_decision(&selection, "scratchpad");
    assert!(
        scratchpad["reason"]
            .as_str()
            .is_some_and(|r| r.contains("list_tables") && r.contains("learned")),
        "{scratchpad}"
    );

    assert!(stdout_of(run(&["learned", "--forget", "list_tables"])).contains("forgot 1"));
    // Issue 40: a name no tool has is an error, not "forgot 0".
    let unknown = run(&["learned", "--forget", "no_such_tool"]);
    assert!(!unknown.status.success());
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(stderr.contains("unknown tool `no_such_tool`"), "{stderr}");
    // A known tool with nothing learned forgets nothing, and says so.
    assert!(stdout_of(run(&["learned", "--forget", "recall"])).contains("forgot 0"));
    let listed = stdout_of(run(&["learned", "--json"]));
    assert!(
        !listed.contains("list_tables") && listed.contains("calculate"),
        "{listed}"
    );
    stdout_of(run(&["learned", "--forget-all"]));
    assert!(stdout_of(run(&["learned"])).contains("nothing learned yet"));

    stdout_of(run(&["settings", "set", "learning", "off"]));
    let refused = run(&["learn", "--cases", cases_arg]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("learning is off"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(stdout_of(run(&["learned"])).contains("nothing learned yet"));
}

/// Issue 40: an unconfigured domain is named only on real evidence. "what time is it
/// in Seoul?" shares "time" with the file tools, but `current_time` (always on)
/// explains it: nothing is named. A message about files names filesystem, with where
/// its key is set (the operator's: not `set_setting`).
#[test]
fn route_names_an_unconfigured_domain_only_on_real_evidence_and_says_where_it_is_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let route = |message: &str| {
        stdout_of(
            loadout(dir.path())
                .args(["route", "--lexical", message])
                .output()
                .expect("run loadout"),
        )
    };
    let seoul = route("what time is it in Seoul?");
    assert!(!seoul.contains("not configured"), "{seoul}");
    let files = route("read the file notes.txt from my documents folder");
    assert!(
        files.contains(
            "not sent: filesystem (not configured: set filesystem_roots): the operator sets filesystem_roots from the dashboard or `loadout settings set` (`set_setting` may not)"
        ),
        "{files}"
    );
    let tools = stdout_of(
        loadout(dir.path())
            .args(["tools", "--no-upstream"])
            .output()
            .expect("run loadout"),
    );
    assert!(
        tools.contains("inactive: the operator sets filesystem_roots from the dashboard"),
        "{tools}"
    );
    // The model's list_domains says so too.
    let domains: Value = serde_json::from_str(&stdout_of(
        loadout(dir.path())
            .args(["call", "list_domains", "--args", "{}"])
            .output()
            .expect("run loadout"),
    ))
    .expect("JSON");
    let filesystem = domains
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == "filesystem"))
        .unwrap_or_else(|| panic!("no filesystem in {domains}"));
    assert!(
        filesystem["how_to_configure"]
            .as_str()
            .is_some_and(|h| h.contains("`set_setting` may not")),
        "{filesystem}"
    );
}

/// Issue 40: the text of `loadout route` names the keyword that sent a domain.
#[test]
fn route_text_names_the_keyword_that_matched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = stdout_of(
        loadout(dir.path())
            .args(["route", "--lexical", "make a table of my expenses"])
            .output()
            .expect("run loadout"),
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("  scratchpad: keyword"));
    assert!(
        line.is_some_and(|l| l.contains("keyword \"table\"")),
        "{text}"
    );
}

/// Issue 40: each subcommand's help sets the global options apart from its own.
#[test]
fn subcommand_help_puts_the_global_options_under_their_own_heading() {
    let dir = tempfile::tempdir().expect("tempdir");
    for command in ["route", "tools", "learned", "serve"] {
        let help = stdout_of(
            loadout(dir.path())
                .args([command, "--help"])
                .output()
                .expect("run loadout"),
        );
        let (own, global) = help
            .split_once("Global options:")
            .unwrap_or_else(|| panic!("no global heading in {command} --help:\n{help}"));
        for option in ["--data-dir <", "--database-url <", "--config <"] {
            assert!(
                global.contains(option) && !own.contains(option),
                "{command} --help:\n{help}"
            );
        }
    }
}

/// Issue 40: `loadout route "…" | head -1` ends quietly when its reader goes away,
/// without a "failed printing to stdout" panic.
#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    use std::io::Read as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = loadout(dir.path())
        .args(["route", "--lexical", "make a table of my expenses"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run loadout");
    // The reader closes before the command writes anything, as `head` does after its
    // lines: every write of the command meets a closed pipe.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
}

/// Issue 40: `loadout clients add` prints a token once and keeps only its hash;
/// `list` shows what each client may reach, never the token; `revoke` removes it.
/// Names that are no domain or tool are refused by name.
#[test]
fn clients_are_added_with_a_token_shown_once_listed_and_revoked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |args: &[&str]| {
        loadout(dir.path())
            .args(args)
            .output()
            .expect("run loadout")
    };
    let added = stdout_of(run(&[
        "clients",
        "add",
        "notes-agent",
        "--domains",
        "memory",
        "--tools",
        "calculate",
        "--rate",
        "30/min",
        "--read-only",
    ]));
    let token = added
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(token.len(), 48, "{added}");
    let listed = stdout_of(run(&["clients", "list"]));
    assert!(
        listed
            .starts_with("notes-agent domains memory tools calculate rate 30/min read-only since "),
        "{listed}"
    );
    assert!(!listed.contains(&token), "{listed}");
    let database = std::fs::read(dir.path().join("loadout.db")).expect("database");
    assert!(
        !database.windows(token.len()).any(|w| w == token.as_bytes()),
        "the token is stored in clear"
    );
    let again = run(&["clients", "add", "notes-agent"]);
    assert!(!again.status.success());
    let wrong = run(&["clients", "add", "other", "--domains", "no_such_domain"]);
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("no domain is named `no_such_domain`"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    assert!(stdout_of(run(&["clients", "revoke", "notes-agent"])).contains("revoked"));
    assert_eq!(stdout_of(run(&["clients", "list"])), "");
    assert!(!run(&["clients", "revoke", "notes-agent"]).status.success());
}

/// Issue 37: `loadout fit` replays a session's learned entries as one conversation
/// in the order the session taught them (what the `next_step` feature learns from), and
/// an entry of no session as a conversation of its own.
#[tokio::test(flavor = "multi_thread")]
async fn fit_replays_a_sessions_learned_entries_as_one_conversation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = loadout_store::Store::open_dir(dir.path())
        .await
        .expect("store");
    let things = ["ledgers", "invoices", "receipts", "budgets", "payrolls"];
    let mut at_ms = 1_700_000_000_000;
    for s in 0..20 {
        let thing = things[s % things.len()];
        for (session, message, tool) in [
            (
                Some(format!("s{s}")),
                format!("which tables hold the {thing} of week {s}"),
                "list_tables",
            ),
            (
                Some(format!("s{s}")),
                format!("remember that week {s} {thing} are done"),
                "remember",
            ),
            (
                None,
                format!("note down the {thing} owner of week {s}"),
                "remember",
            ),
        ] {
            at_ms += 1;
            let write = loadout_store::LearnedWrite {
                at_ms,
                session,
                source: "chat".to_owned(),
                message,
                tools: vec![tool.to_owned()],
                model: None,
                vector: None,
            };
            store.learned_insert(write, 1000).await.expect("learn");
        }
    }
    drop(store);
    let out = loadout(dir.path())
        .args(["fit", "--lexical", "--folds", "2", "--dry-run"])
        .output()
        .expect("run loadout");
    let stdout = stdout_of(out);
    assert!(
        stdout.contains("60 learned entries (40 conversations) of no stored session"),
        "{stdout}"
    );
}

/// Issue 37: `loadout fit` fits the scorer on what the deployment learned (folds by
/// conversation), says how the held-out folds route before and after, and writes
/// `weights.json` in the data dir; every command then routes with it. Too little
/// data is refused; a broken file stops commands with its name; `--reset` removes
/// it even then.
#[test]
fn fit_refits_the_scorer_on_the_learned_memory_and_routes_with_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |args: &[&str]| {
        loadout(dir.path())
            .args(args)
            .output()
            .expect("run loadout")
    };
    let refused = run(&["fit", "--lexical"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("too little to fit"), "{stderr}");

    // Forty conversations of one turn each: a coined verb means a scratchpad table.
    let things = ["ledgers", "invoices", "receipts", "budgets", "payrolls"];
    let mut lines = Vec::new();
    for i in 0..40 {
        let thing = things[i % things.len()];
        let (user, tool) = if i % 2 == 0 {
            (format!("zorblax the {thing} of week {i}"), "list_tables")
        } else {
            (
                format!("remember that the {thing} of week {i} are due"),
                "remember",
            )
        };
        lines.push(
            serde_json::json!({"id": format!("c{i}"), "configured": "all",
                "turns": [{"user": user, "needed": [tool]}]})
            .to_string(),
        );
    }
    let cases = dir.path().join("cases.jsonl");
    std::fs::write(&cases, lines.join("\n")).expect("write cases");
    stdout_of(run(&["learn", "--cases", cases.to_str().expect("utf-8")]));

    let weights = dir.path().join("weights.json");
    let dry = stdout_of(run(&["fit", "--lexical", "--folds", "2", "--dry-run"]));
    assert!(
        dry.contains("weights in force: shipped") && dry.contains("all folds: turns 40"),
        "{dry}"
    );
    assert!(dry.contains("with the weights before the fit"), "{dry}");
    assert!(!weights.exists());

    let fitted = stdout_of(run(&["fit", "--lexical", "--folds", "2", "--force"]));
    assert!(fitted.contains("wrote "), "{fitted}");
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(&weights).expect("weights.json"))
            .expect("weights JSON");
    assert_eq!(file["fitted"]["cases"], "stored sessions", "{file}");
    assert_eq!(file["fitted"]["lexical"]["positive"], 40, "{file}");
    let again = stdout_of(run(&["fit", "--lexical", "--folds", "2", "--dry-run"]));
    assert!(
        again.contains("weights in force: weights.json (fitted "),
        "{again}"
    );
    // Routed with the fitted weights: the learned verb brings its table tool.
    let routed = stdout_of(run(&["route", "zorblax the audits", "--lexical", "--json"]));
    assert!(routed.contains("\"list_tables\""), "{routed}");

    // A cap below what the core tools alone take: the fit says it cannot keep to it,
    // and sends the fewest it found.
    let capped = stdout_of(run(&[
        "fit",
        "--lexical",
        "--folds",
        "2",
        "--max-mean-tools",
        "6",
        "--force",
    ]));
    assert!(
        capped.contains("no rule tried sends at most 6 tools a turn; the fewest sent"),
        "{capped}"
    );
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(&weights).expect("weights.json"))
            .expect("weights JSON");
    assert_eq!(file["fitted"]["max_mean_tools"], 6.0, "{file}");

    std::fs::write(&weights, "{\"lexical\": 1}").expect("break the file");
    let broken = run(&["route", "hello", "--lexical"]);
    assert!(!broken.status.success());
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert!(stderr.contains("weights.json"), "{stderr}");
    assert!(stdout_of(run(&["fit", "--reset"])).contains("removed"));
    assert!(!weights.exists());
    stdout_of(run(&["route", "hello", "--lexical"]));
}
