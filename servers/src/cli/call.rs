//! `loadout call TOOL --args JSON`: one tool call through the registry, validated,
//! and audited like a served call (client `cli`).

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use loadout_store::{AuditRow, now_ms};

use crate::app::App;
use crate::log_writer::{AuditWriter, audit_args, error_kind};

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
    let started = Instant::now();
    let result = app.registry.call(&args.tool, arguments.clone(), ctx).await;
    // Written before the result is printed, as a served call's row is written before
    // its answer goes out.
    let (outcome, detail) = match &result {
        Ok(_) => ("ok".to_owned(), None),
        Err(error) => (error_kind(error), Some(error.to_string())),
    };
    AuditWriter::new(app.store().clone())
        .record(AuditRow {
            at_ms: now_ms(),
            client: "cli".into(),
            tool: args.tool.chars().take(128).collect(),
            args: audit_args(&arguments),
            outcome,
            detail,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
        })
        .await;
    match result {
        Ok(value) => {
            outln!("{}", serde_json::to_string_pretty(&value)?)?;
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
