//! placeholder

use loadout::ToolContext;
use loadout::schemars::JsonSchema;
use loadout::serde::Deserialize;

loadout::domain! {
    name: "core",
    description: "Loadout itself.",
    keywords: ["loadout"],
    always_on: true,
}

#[derive(Deserialize, JsonSchema)]
#[serde(crate = "loadout::serde")]
#[schemars(crate = "loadout::schemars")]
pub struct EchoArgs {
    /// Text to echo.
    pub text: String,
}

/// Echoes text. Used to check the macro.
#[loadout::tool(domain = "core", keywords = ["echo"], read_only = true)]
pub async fn echo(args: EchoArgs, ctx: &ToolContext) -> Result<String, String> {
    Ok(format!("{}:{}", ctx.namespace(), args.text))
}

/// Says hi.
#[loadout::tool(domain = "core")]
pub fn hello() -> &'static str {
    "hi"
}

/// Referenced by the `loadout-domains` hub so the linker keeps this crate.
pub fn link() {}
