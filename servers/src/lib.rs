//! The `loadout` binary's library: command-line interface, chat server and MCP server.
//!
//! This crate is the only one that knows wire formats and processes: it links every
//! domain through `loadout-domains`, opens the store, and hands messages to the
//! router and calls to the registry.

pub mod api_error;
pub mod app;
pub mod cli;
pub mod clients;
pub mod config;
pub mod decision_log;
pub mod http;
pub mod learning;
pub mod listener;
pub mod log_writer;
pub mod mcp;
pub mod metrics;
pub mod retention;
pub mod routing;
pub mod settings;
pub mod telemetry;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The heading of the options every subcommand takes, apart from its own in `--help`.
const GLOBAL_OPTIONS: &str = "Global options";

#[derive(Parser, Debug)]
#[command(
    name = "loadout",
    version,
    about = "Tool registry and router for AI agents"
)]
pub struct Cli {
    /// Directory for the database and per-session files.
    #[arg(long, env = "LOADOUT_DATA_DIR", global = true, help_heading = GLOBAL_OPTIONS)]
    data_dir: Option<PathBuf>,
    /// State backend URL; default: SQLite `loadout.db` in the data dir.
    #[arg(long, env = "LOADOUT_DATABASE_URL", global = true, help_heading = GLOBAL_OPTIONS)]
    database_url: Option<String>,
    /// Config file: `[router]` tunables and upstream `[servers.<name>]`; default:
    /// `loadout.toml` in the data dir, if it exists.
    #[arg(long, env = "LOADOUT_CONFIG", global = true, value_name = "PATH", help_heading = GLOBAL_OPTIONS)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Domains and tools: active or not and why, token cost.
    Tools(cli::tools::Args),
    /// Calls one tool with JSON arguments.
    Call(cli::call::Args),
    /// What the router would send for a message, and why.
    Route(cli::route::Args),
    /// The stored sessions routed again with the current tools and config: did each
    /// turn get the tools its model called?
    Replay(cli::replay::Args),
    /// Fits the router's scorer on this deployment's sessions and learned memory
    /// (folds by conversation) and writes `weights.json` in the data dir.
    Fit(cli::fit::Args),
    /// Reads and writes settings.
    #[command(subcommand)]
    Settings(cli::settings::Command),
    /// Clients with tokens of their own: `add NAME`, `list`, `revoke NAME`.
    #[command(subcommand)]
    Clients(cli::clients::Command),
    /// Prints the newest tool calls from the audit log.
    Audit(cli::audit::Args),
    /// Prints the newest routing decisions from the decision log, with their reasons.
    Decisions(cli::decisions::Args),
    /// What the router learned from use, and from what; `--forget TOOL`,
    /// `--forget-all`.
    Learned(cli::learned::Args),
    /// Imports labeled turns (the eval format `loadout replay --export` writes) into
    /// the learned memory.
    Learn(cli::learned::LearnArgs),
    /// Serves the chat API and dashboard.
    Serve(http::Args),
    /// Serves every tool over MCP (stdio by default).
    Mcp(mcp::Args),
}

/// Whether a command failed only because its reader went away (`… | head -1`): the
/// binary then exits quietly, as a command-line tool does, rather than print an
/// error about a pipe the user closed on purpose.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Runs one parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = app::Config {
        data_dir: cli.data_dir.unwrap_or_else(app::default_data_dir),
        database_url: cli.database_url,
        config_file: cli.config,
    };
    // Before the app opens: a weights file it cannot read is what `--reset` removes.
    if let Command::Fit(args) = &cli.command
        && args.reset
    {
        return cli::fit::reset(&config.data_dir);
    }
    let app = app::App::open(&config).await?;
    match cli.command {
        Command::Tools(args) => cli::tools::run(&app, args).await,
        Command::Call(args) => cli::call::run(&app, args).await,
        Command::Route(args) => cli::route::run(&app, args).await,
        Command::Replay(args) => cli::replay::run(&app, args).await,
        Command::Fit(args) => cli::fit::run(&app, args).await,
        Command::Settings(command) => cli::settings::run(&app, command).await,
        Command::Clients(command) => cli::clients::run(&app, command).await,
        Command::Audit(args) => cli::audit::run(&app, args).await,
        Command::Decisions(args) => cli::decisions::run(&app, args).await,
        Command::Learned(args) => cli::learned::run(&app, args).await,
        Command::Learn(args) => cli::learned::learn(&app, args).await,
        Command::Mcp(args) => mcp::run(&app, args).await,
        Command::Serve(args) => http::run(app, args).await,
    }
}
