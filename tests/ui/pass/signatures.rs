use loadout::ToolContext;
use schemars::JsonSchema;
use serde::Deserialize;

loadout::domain! {
    name: "ui_pass",
    description: "Signatures the macro accepts.",
    keywords: ["pass"],
}

#[derive(Deserialize, JsonSchema)]
struct Args {
    /// A number.
    n: i64,
}

/// No arguments, plain return.
#[loadout::tool(domain = "ui_pass")]
fn none() -> &'static str {
    "ok"
}

/// Arguments struct and a `Result`.
#[loadout::tool(domain = "ui_pass", keywords = ["double", "두 배"], read_only = true)]
async fn double(args: Args) -> Result<i64, String> {
    Ok(args.n * 2)
}

/// Context first, arguments second, custom name and every annotation.
#[loadout::tool(
    domain = "ui_pass",
    name = "with-context",
    title = "With context",
    tier = "pro",
    examples = ["do it with context"],
    conflicts = ["none"],
    read_only = false,
    destructive = true,
    idempotent = false,
    open_world = true,
)]
async fn with_context(ctx: &ToolContext, args: Args) -> Result<String, std::io::Error> {
    Ok(format!("{}:{}", ctx.namespace(), args.n))
}

fn main() {
    let registry = loadout::Registry::from_inventory().expect("registry builds");
    let names: Vec<&str> = registry.all_tools().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["double", "none", "with-context"]);
    let tool = registry.tool("with-context").expect("registered");
    assert_eq!(tool.annotations.destructive, Some(true));
    assert_eq!(tool.tier, loadout::Tier::Pro);
}
