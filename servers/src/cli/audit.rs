//! `loadout audit [--tail N]`: the newest tool calls from the audit log, times in
//! ISO 8601 UTC.

use std::process::ExitCode;

use crate::app::App;
use crate::log_writer::{audit_json, iso_utc};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// How many rows, newest last.
    #[arg(long, default_value_t = 20)]
    tail: usize,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
}

pub async fn run(app: &App, args: Args) -> anyhow::Result<ExitCode> {
    let rows = app.store().audit_tail(args.tail).await?;
    for row in rows {
        if args.json {
            outln!("{}", serde_json::to_string(&audit_json(&row))?)?;
        } else {
            outln!(
                "{} {:<12} {:<20} {:<14} {:>8.1}ms {}",
                iso_utc(row.at_ms),
                row.client,
                row.tool,
                row.outcome,
                row.duration_ms,
                row.args
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
