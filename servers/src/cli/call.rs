//! `loadout call TOOL --args JSON`: one tool call through the registry, validated.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::app::App;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tool name.
    tool: String,
    /// Arguments as a JSON object.
    #[arg(long, default_value = "{}")]
    args: String,
    /// Session namespace (scratchpad database, router state).
    #[arg(long)]
    session: Option<String>,
}

pub async fn run(app: &App, args: Args) -> anyhow::Result<ExitCode> {
    let arguments: serde_json::Value = serde_json::from_str(&args.args)
        .with_context(|| format!("--args is not valid JSON: {}", truncate(&args.args, 200)))?;
    let mut ctx = app.context().with_client("cli");
    if let Some(session) = args.session {
        app.store().session_ensure(&session).await?;
        ctx = ctx.with_session(session);
    }
    match app.registry.call(&args.tool, arguments, ctx).await {
        Ok(value) => {
            println!("{}", serde_json::to_string_pretty(&value)?);
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("error: {error}");
            Ok(ExitCode::from(2))
        }
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(max_chars).collect::<String>())
    }
}
