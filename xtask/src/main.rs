//! Project tasks: `cargo xtask lint | eval | fit | bench | bench-route | load | ci`.
//!
//! Each task lives in its own module with its options; this file only dispatches.

mod bench;
mod bench_log;
mod bench_route;
mod ci;
mod eval;
mod fit;
mod fixed_rate;
mod lint;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "Loadout's project tasks"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand, Debug)]
enum Task {
    /// Checks domains and tools (keywords, names, descriptions, schemas, linking).
    Lint(lint::Args),
    /// Replays labeled conversations through the router: recall, tools, tokens, misses.
    Eval(eval::Args),
    /// Fits the router's scorer, k folds by conversation, and writes the weights file.
    Fit(fit::Args),
    /// Routing time per message against a naive baseline.
    Bench(bench::Args),
    /// `/api/route` under wrk: SQLite vs PostgreSQL, decision log on and off.
    BenchRoute(bench_route::Args),
    /// The fixed-rate load of bench-route alone, against a running server.
    Load(bench_route::LoadArgs),
    /// fmt, clippy, lint, tests and the eval gate, each timed.
    Ci(ci::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Lint(args) => lint::run(&args),
        Task::Eval(args) => eval::run(&args),
        Task::Fit(args) => fit::run(&args),
        Task::Bench(args) => bench::run(&args),
        Task::BenchRoute(args) => bench_route::run(&args),
        Task::Load(args) => bench_route::load(&args),
        Task::Ci(args) => ci::run(&args),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// clap checks the whole command tree (names, defaults, conflicts) here rather
    /// than when a user first runs a task.
    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
