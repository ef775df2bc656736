//! `loadout tools`: every domain and tool, active or not and why, token cost; the
//! upstream MCP servers' (`[servers]` of `loadout.toml`) included, as `serve` and
//! `mcp` serve them.

use std::process::ExitCode;

use loadout::export::Format;
use loadout_router::thousands;
use serde_json::json;

use crate::app::App;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// With --json: also print each definition in this format (mcp, openai, anthropic).
    #[arg(long, value_parser = clap::value_parser!(String))]
    format: Option<String>,
    /// Leave out the upstream MCP servers of `loadout.toml` (by default they are
    /// started, or connected, and their tools listed).
    #[arg(long)]
    no_upstream: bool,
}

pub async fn run(app: &App, args: Args) -> anyhow::Result<ExitCode> {
    let (app, upstreams) = super::as_served(app, None, args.no_upstream).await?;
    let printed = list(&app, &args).await;
    upstreams.shutdown().await;
    printed
}

async fn list(app: &App, args: &Args) -> anyhow::Result<ExitCode> {
    let settings = app.settings.snapshot().await?;
    let registry = &app.registry;
    let format = args
        .format
        .as_deref()
        .map(str::parse::<Format>)
        .transpose()
        .map_err(anyhow::Error::msg)?;

    let mut domains_json = Vec::new();
    let (mut n_active_tools, mut active_tokens) = (0usize, 0usize);
    for domain in registry.domains() {
        let missing = registry.missing_settings(&domain.name, &settings);
        let active = missing.is_empty();
        let status = if domain.always_on {
            "active (always on)".to_owned()
        } else if domain.settings_keys.is_empty() {
            "active (needs no settings)".to_owned()
        } else if active {
            "active (configured)".to_owned()
        } else {
            format!("inactive: {}", loadout::where_to_set(&missing))
        };
        let mut tools_json = Vec::new();
        let mut domain_tokens = 0;
        for tool in registry.tools_of(domain) {
            let tokens = loadout_router::tokens::tool_cost(tool);
            domain_tokens += tokens;
            let mut entry = json!({"name": tool.name, "hint": tool.hint, "tokens": tokens});
            if let Some(format) = format {
                entry["definition"] = format.export(tool);
            }
            tools_json.push(entry);
        }
        if active {
            n_active_tools += tools_json.len();
            active_tokens += domain_tokens;
        }
        domains_json.push(json!({
            "name": domain.name,
            "active": active,
            "status": status,
            "missing_settings": missing,
            "keywords": domain.keywords,
            "tokens": domain_tokens,
            "tools": tools_json,
        }));
    }
    let n_tools = registry.all_tools().len();
    let all_tokens: usize = registry
        .all_tools()
        .iter()
        .map(loadout_router::tokens::tool_cost)
        .sum();

    if args.json {
        let out = json!({
            "domains": domains_json,
            "n_tools": n_tools,
            "n_active_tools": n_active_tools,
            "all_tools_tokens": all_tokens,
            "active_tools_tokens": active_tokens,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    for domain in &domains_json {
        outln!(
            "{:<14} {:>3} tools {:>6} tokens  {}",
            domain["name"].as_str().unwrap_or_default(),
            domain["tools"].as_array().map_or(0, Vec::len),
            thousands(domain["tokens"].as_u64().unwrap_or(0) as usize),
            domain["status"].as_str().unwrap_or_default(),
        )?;
        for tool in domain["tools"].as_array().into_iter().flatten() {
            outln!(
                "    {:<22} {:>5}  {}",
                tool["name"].as_str().unwrap_or_default(),
                tool["tokens"].as_u64().unwrap_or(0),
                tool["hint"].as_str().unwrap_or_default(),
            )?;
        }
    }
    outln!(
        "{n_tools} tools in {} domains; {n_active_tools} active; all tools {} tokens, active {} tokens (o200k_base)",
        domains_json.len(),
        thousands(all_tokens),
        thousands(active_tokens),
    )?;
    Ok(ExitCode::SUCCESS)
}
