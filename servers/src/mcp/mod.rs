//! `loadout mcp`: every registered tool over MCP (stdio or streamable HTTP).

use std::process::ExitCode;

use crate::app::App;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Serve streamable HTTP on this address instead of stdio.
    #[arg(long)]
    http: Option<std::net::SocketAddr>,
    /// Expose only core and the meta-tools; loading tools changes the list.
    #[arg(long)]
    dynamic: bool,
}

pub async fn run(_app: &App, _args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("mcp: not written yet")
}
