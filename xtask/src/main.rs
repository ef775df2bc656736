//! Project tasks: `cargo xtask lint | eval | bench | bench-route | load | ci`.
//!
//! Each task lives in its own module; this file only dispatches.

mod bench;
mod bench_log;
mod bench_route;
mod ci;
mod eval;
mod fit;
mod fixed_rate;
mod lint;

use anyhow::bail;

const USAGE: &str = "usage: cargo xtask <lint | eval | fit | bench | bench-route | load | ci> [options]
  lint                      check domains and tools (keywords, names, descriptions, schemas, linking)
  eval  --catalog DIR --cases FILE [--json]   replay labeled conversations through the router
  fit   --catalog DIR --cases FILE [--folds K]   fit the router's scorer, k folds by conversation
  bench [--quick]           routing time per message against a naive baseline
  bench-route [--postgres URL]   /api/route under wrk: SQLite vs PostgreSQL, decision log on/off
  load --addr HOST:PORT --rate N [--session]   the fixed-rate load alone, against a running server
  ci [--shared DIR] [--skip PHASE,...]   fmt, clippy, lint, tests and the eval gate, each timed";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        bail!("{USAGE}");
    };
    match task.as_str() {
        "lint" => lint::run(rest),
        "eval" => eval::run(rest),
        "fit" => fit::run(rest),
        "bench" => bench::run(rest),
        "bench-route" => bench_route::run(rest),
        "load" => bench_route::load(rest),
        "ci" => ci::run(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown task `{other}`\n{USAGE}"),
    }
}
