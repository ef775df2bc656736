//! The `loadout` binary as a user runs it.

use std::process::Command;

fn loadout(data_dir: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_loadout"));
    command
        .env("LOADOUT_DATA_DIR", data_dir)
        .env_remove("LOADOUT_DATABASE_URL");
    command
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
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listing: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
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
