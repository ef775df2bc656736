//! Toolkit files (`--catalog`): parsed and built into a registry, or refused with
//! an error; the tools of what builds export in every format.
#![no_main]

libfuzzer_sys::fuzz_target!(|text: &str| {
    let Ok(toolkit) = loadout::toolkit::parse(text, "fuzz.json") else {
        return;
    };
    let Ok(registry) = loadout::Registry::builder().toolkit(toolkit).build() else {
        return;
    };
    for tool in registry.all_tools() {
        let _ = loadout::export::mcp(tool);
        let _ = loadout::export::openai(tool);
        let _ = loadout::export::anthropic(tool);
        let _ = registry.validate(&tool.name, &serde_json::json!({}));
    }
});
