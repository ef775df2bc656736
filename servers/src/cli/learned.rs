//! `loadout learned [--tool T] [--json] | --forget TOOL | --forget-all`: what the
//! router learned from use, and from what; and `loadout learn --cases FILE`: imports
//! labeled turns (the eval format `loadout replay --export` writes).
//!
//! Running servers see a change at their next poll of the store's learned version.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use loadout_router::replay::{cases_from_json_lines, learned_turns};
use loadout_store::{LearnOutcome, LearnedWrite, now_ms};

use crate::app::App;
use crate::learning::{ENTRIES_PER_TOOL, LearnSource};
use crate::log_writer::iso_utc;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only this tool, with each of its entries.
    #[arg(long, conflicts_with_all = ["forget", "forget_all"])]
    tool: Option<String>,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
    /// Forgets what was learned for this tool.
    #[arg(long, value_name = "TOOL", conflicts_with = "forget_all")]
    forget: Option<String>,
    /// Forgets everything learned.
    #[arg(long)]
    forget_all: bool,
}

#[derive(clap::Args, Debug)]
pub struct LearnArgs {
    /// Labeled conversations as JSON lines, one case a line (`loadout replay
    /// --export` writes them): each turn teaches its message the tools it called
    /// (`called`, else `needed`).
    #[arg(long, value_name = "FILE")]
    cases: PathBuf,
    /// Also accept the tools of the toolkit files (`*.json`) of this directory.
    #[arg(long, value_name = "DIR")]
    catalog: Option<PathBuf>,
}

pub async fn run(app: &App, args: Args) -> anyhow::Result<ExitCode> {
    let store = app.store();
    if args.forget_all || args.forget.is_some() {
        let n = store.learned_forget(args.forget.as_deref()).await?;
        match &args.forget {
            // A typo'd name would otherwise read as success ("forgot 0"); a tool no
            // longer linked but with entries still forgets them.
            Some(tool) if n == 0 && app.registry.tool(tool).is_none() => {
                anyhow::bail!(
                    "unknown tool `{tool}`: no tool has that name and nothing was learned for it; `loadout learned` lists the tools with entries"
                )
            }
            Some(tool) => outln!("forgot {n} learned entries of {tool}")?,
            None => outln!("forgot {n} learned entries")?,
        }
        return Ok(ExitCode::SUCCESS);
    }
    let summary = store.learned_summary(args.tool.as_deref()).await?;
    if args.json {
        for tool in &summary {
            outln!("{}", serde_json::to_string(tool)?)?;
        }
    } else if summary.is_empty() {
        match &args.tool {
            Some(tool) => outln!("nothing learned for {tool}")?,
            None => outln!("nothing learned yet")?,
        }
    } else {
        for tool in &summary {
            let sources: Vec<String> = tool
                .sources
                .iter()
                .map(|(source, n)| format!("{source} {n}"))
                .collect();
            outln!(
                "{}: {} entries ({} uses; {}), newest {}: {:?}",
                tool.tool,
                tool.entries,
                tool.uses,
                sources.join(", "),
                iso_utc(tool.newest_ms),
                tool.example
            )?;
        }
    }
    if let Some(tool) = &args.tool {
        for row in store.learned_rows(Some(tool), None).await? {
            if args.json {
                outln!("{}", serde_json::to_string(&row)?)?;
            } else {
                outln!(
                    "  {} {} {} ×{} {:?} → {}",
                    iso_utc(row.at_ms),
                    row.source,
                    row.session.as_deref().unwrap_or("-"),
                    row.n_merged,
                    row.message,
                    row.tools.join(", ")
                )?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn learn(app: &App, args: LearnArgs) -> anyhow::Result<ExitCode> {
    let settings = app.settings.snapshot().await?;
    if settings
        .get(crate::learning::LEARNING_SETTING)
        .is_some_and(|v| v.trim() == "off")
    {
        anyhow::bail!("learning is off (setting `learning = off`): nothing imported");
    }
    let text = std::fs::read_to_string(&args.cases)
        .with_context(|| format!("cannot read {}", args.cases.display()))?;
    let cases = cases_from_json_lines(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.cases.display()))?;
    let registry = match &args.catalog {
        Some(dir) => crate::app::with_toolkits(&app.registry, dir)?,
        None => app.registry.clone(),
    };
    let store = app.store();
    let (mut added, mut merged, mut unknown) = (0usize, 0usize, std::collections::BTreeSet::new());
    for turn in learned_turns(&cases) {
        let message = turn.message;
        let (known, missing): (Vec<String>, Vec<String>) = turn
            .tools
            .into_iter()
            .filter(|t| !loadout::meta::ALL.contains(&t.as_str()))
            .partition(|t| registry.tool(t).is_some());
        unknown.extend(missing);
        if known.is_empty() || message.trim().is_empty() {
            continue;
        }
        let outcome = store
            .learned_insert(
                LearnedWrite {
                    at_ms: now_ms(),
                    session: None,
                    source: LearnSource::Import.as_str().to_owned(),
                    message,
                    tools: known,
                    model: None,
                    vector: None,
                },
                ENTRIES_PER_TOOL,
            )
            .await?;
        match outcome {
            LearnOutcome::Added { .. } => added += 1,
            LearnOutcome::Merged { .. } => merged += 1,
            LearnOutcome::Nothing => {}
        }
    }
    outln!(
        "learned {added} turns from {} ({merged} merged into entries already learned)",
        args.cases.display()
    )?;
    if !unknown.is_empty() {
        let names: Vec<&str> = unknown.iter().map(String::as_str).take(20).collect();
        eprintln!(
            "warning: {} tool names no tool has were left out: {}",
            unknown.len(),
            names.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
