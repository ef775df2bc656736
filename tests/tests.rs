#[tokio::test]
async fn smoke() {
    let registry = std::sync::Arc::new(loadout_domains::registry().expect("registry"));
    let dir = tempfile::tempdir().expect("tmp");
    let store = loadout::Store::open_dir(dir.path()).await.expect("store");
    let ctx = loadout::ToolContext::new(registry.clone(), loadout::Settings::new(store));
    println!(
        "{:?}",
        registry
            .all_tools()
            .iter()
            .map(|t| (&t.name, &t.input_schema))
            .collect::<Vec<_>>()
    );
    let out = registry
        .call("echo", serde_json::json!({"text": "x"}), ctx.clone())
        .await;
    println!("{out:?}");
    let out = registry
        .call("echo", serde_json::json!({"text": 3}), ctx.clone())
        .await;
    println!("{out:?}");
    let out = registry.call("hello", serde_json::Value::Null, ctx).await;
    println!("{out:?}");
}
