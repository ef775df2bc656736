//! The fixed-rate runs' request bodies, and `cargo xtask load`: the fixed-rate load of
//! `bench-route` against a server that is already running, for profiling it (e.g.
//! under `perf`) one setting at a time.

use std::time::Duration;

use super::MESSAGES;
use crate::fixed_rate;

/// `cargo xtask load`'s options.
#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// The running server's address.
    #[arg(long, value_name = "HOST:PORT")]
    addr: String,
    /// Requests per second to offer.
    #[arg(long, value_name = "N")]
    rate: f64,
    /// Seconds of load.
    #[arg(long, value_name = "S", default_value_t = 10)]
    duration: u64,
    /// Connections, each with one request in flight.
    #[arg(long, value_name = "N", default_value_t = 32)]
    connections: usize,
    /// Messages spread over 64 sessions, as bench-route's session requests.
    #[arg(long, conflicts_with = "distinct")]
    session: bool,
    /// Number every message, so that none is in the server's cache of message
    /// vectors: the dense stage's encoder runs for each.
    #[arg(long)]
    distinct: bool,
}

/// The request bodies of the fixed-rate runs, in the order the wrk scripts send them.
pub(super) struct Bodies {
    pub(super) plain: Vec<String>,
    pub(super) session: Vec<String>,
}

pub(super) fn request_bodies() -> Bodies {
    let json = |m: &str| serde_json::to_string(m).unwrap_or_default();
    // The wrk scripts pair session `counter % 64` with message `counter % 6`: one
    // cycle is their least common multiple.
    let n = 64 * MESSAGES.len() / gcd(64, MESSAGES.len());
    Bodies {
        plain: MESSAGES
            .iter()
            .map(|m| format!("{{\"message\": {}}}", json(m)))
            .collect(),
        session: (1..=n)
            .map(|counter| {
                format!(
                    "{{\"session\": \"bench-{}\", \"message\": {}}}",
                    counter % 64,
                    json(MESSAGES[counter % MESSAGES.len()])
                )
            })
            .collect(),
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The fixed-rate load at `--rate`, its achieved rate and latency printed.
pub fn load(args: &LoadArgs) -> anyhow::Result<()> {
    let bodies = request_bodies();
    let numbered: Vec<String>;
    let bodies = if args.session {
        &bodies.session
    } else if args.distinct {
        // More messages than the run sends at any rate this machine reaches.
        numbered = (0..200_000)
            .map(|n| {
                let message = format!("{} (#{n})", MESSAGES[n % MESSAGES.len()]);
                serde_json::json!({ "message": message }).to_string()
            })
            .collect();
        &numbered
    } else {
        &bodies.plain
    };
    // Numbered messages: each connection takes its own, so none repeats.
    let stride = if args.distinct { args.connections } else { 1 };
    let load = fixed_rate::run_strided(
        &args.addr,
        "/api/route",
        bodies,
        args.rate,
        args.connections,
        Duration::from_secs(args.duration),
        stride,
    )?;
    println!(
        "{:.0} req/s  p50 {:.2} ms  p99 {:.2} ms  errors {}",
        load.achieved_per_s, load.p50_ms, load.p99_ms, load.errors
    );
    Ok(())
}
