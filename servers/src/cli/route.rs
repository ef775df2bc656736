//! `loadout route "message"`: what the router would send for a message, and why.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use crate::app::App;
use crate::routing::TurnRequest;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The user's message.
    message: String,
    /// Session id: stickiness and the turn clock persist across calls.
    #[arg(long)]
    session: Option<String>,
    /// Route as if these settings were set: `all`, or comma-separated keys. Nothing
    /// is written. Default: the stored settings.
    #[arg(long)]
    configured: Option<String>,
    /// Also load the toolkit files of this directory.
    #[arg(long)]
    catalog: Option<PathBuf>,
    /// Print the whole selection as JSON.
    #[arg(long)]
    json: bool,
    /// Route lexical-only, without the dense stage `loadout serve` routes with
    /// (unless `router_dense = off`). Its tool vectors come from the data dir's cache,
    /// or are computed once (a few seconds).
    #[arg(long)]
    lexical: bool,
    /// Leave out the upstream MCP servers of `loadout.toml`. By default they are
    /// started (or connected) as `loadout serve` does, so their tools route too.
    #[arg(long)]
    no_upstream: bool,
}

pub async fn run(app: &App, args: Args) -> anyhow::Result<ExitCode> {
    let (app, upstreams) = super::as_served(app, args.catalog.as_deref(), args.no_upstream).await?;
    let printed = route_and_print(&app, &args).await;
    app.shutdown_routing().await;
    upstreams.shutdown().await;
    printed.map(|()| ExitCode::SUCCESS)
}

async fn route_and_print(app: &App, args: &Args) -> anyhow::Result<()> {
    // The same stages as `loadout serve`, so that what this prints is what the
    // server would send.
    if !args.lexical {
        app.wait_for_dense_stage().await;
    }
    let settings = match args.configured.as_deref() {
        None => app.settings.snapshot().await?,
        Some(configured) => Arc::new(assumed_settings(app, configured)?),
    };
    // What was learned, as the server routes with it (built here before routing,
    // where the server builds it in the background).
    app.routing().learner.refresh().await;
    let routed = app
        .routing()
        .route(
            app.store(),
            settings,
            TurnRequest {
                session: args.session.as_deref(),
                message: &args.message,
                called: &[],
                token_budget: None,
            },
        )
        .await?;
    let selection = &routed.selection;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(selection)?)?;
    } else {
        outln!("{}", selection.summary_line())?;
        // Why each domain was sent, e.g. `keyword "table"`: the summary gives only
        // the stage.
        for domain in &selection.domains {
            if domain.included && domain.stage != loadout_router::Stage::AlwaysOn {
                outln!(
                    "  {}: {} {:.2}, {}",
                    domain.domain,
                    domain.stage,
                    domain.score,
                    domain.reason
                )?;
            }
        }
        for tool in &selection.tools {
            outln!(
                "  {:<28} {:<14} {:<10} {:.2} {:>5} tokens{}{}",
                tool.name,
                tool.domain,
                tool.stage,
                tool.score,
                tool.tokens,
                if tool.why.is_empty() { "" } else { "  " },
                tool.why
            )?;
        }
        for unconfigured in &selection.unconfigured {
            outln!(
                "not sent: {unconfigured}: {}",
                loadout::where_to_set(&unconfigured.missing_settings)
            )?;
        }
        if !selection.hints.is_empty() {
            outln!("hints ({} tokens):", selection.hint_tokens)?;
            for hint in &selection.hints {
                outln!("  {:<28} {}", hint.name, hint.hint)?;
            }
        }
    }
    Ok(())
}

/// `all` → every settings key of every domain; otherwise the listed keys, each of
/// which some domain must declare: a misspelt key would otherwise route as if nothing
/// were configured, and say nothing.
fn assumed_settings(app: &App, configured: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let declared: std::collections::BTreeSet<&str> = app
        .registry
        .domains()
        .iter()
        .flat_map(|d| d.settings_keys.iter().map(String::as_str))
        .collect();
    let keys: Vec<String> = if configured.trim() == "all" {
        declared.iter().map(|k| (*k).to_owned()).collect()
    } else {
        configured
            .split(',')
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
            .collect()
    };
    let unknown: Vec<&str> = keys
        .iter()
        .map(String::as_str)
        .filter(|k| !declared.contains(k))
        .collect();
    if !unknown.is_empty() {
        anyhow::bail!(
            "--configured: no domain declares {}; the keys domains declare: {}",
            unknown
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", "),
            declared.iter().copied().collect::<Vec<_>>().join(", ")
        );
    }
    Ok(keys
        .into_iter()
        .map(|k| (k, "(assumed)".to_owned()))
        .collect())
}
