//! `loadout decisions [--tail N] [--session ID] [--json]`: the newest routing
//! decisions from the decision log, with their reasons. On SQLite the reasons are
//! stored compact (tools and domains by index); this prints them as JSON.

use std::process::ExitCode;

use crate::app::App;
use crate::log_writer::iso_utc;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// How many rows, newest last.
    #[arg(long, default_value_t = 20)]
    tail: usize,
    /// Only this session's rows.
    #[arg(long)]
    session: Option<String>,
    /// Print JSON lines (the whole row, reasons included).
    #[arg(long)]
    json: bool,
}

pub async fn run(app: &App, args: Args) -> anyhow::Result<ExitCode> {
    let store = app.store();
    let rows = match &args.session {
        Some(session) => {
            let mut rows = store.decisions(session).await?;
            let skip = rows.len().saturating_sub(args.tail);
            rows.drain(..skip);
            rows
        }
        None => store.decisions_tail(args.tail).await?,
    };
    for row in rows {
        if args.json {
            outln!("{}", serde_json::to_string(&row)?)?;
        } else {
            outln!(
                "{} {} turn {} {} tools {} tokens {:?}\n  {}",
                iso_utc(row.at_ms),
                row.session.as_deref().unwrap_or("-"),
                row.turn,
                row.n_tools,
                row.tokens,
                row.message,
                row.reasons.to_json()
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
