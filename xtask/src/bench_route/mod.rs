//! `cargo xtask bench-route`: `POST /api/route` under load from a second process on
//! loopback (issues 5 and 7).
//!
//! For each backend (SQLite in a fresh data dir; PostgreSQL when `--postgres URL` is
//! given) and each decision-log setting (`plain`, `off`), starts `loadout serve` with
//! lexical routing (`router_dense = off`, the path the 20k req/s target is for), warms
//! it up and runs `wrk` (Debian package `wrk`) twice: one-off messages, and messages
//! spread over 64 sessions (state read, message append, decision log). Prints
//! requests/s and p50/p99 per run, and what the decision log costs at p99 as a ratio
//! from the same run. Then, for each setting again, the same fixed request rate (half
//! the lower saturated rate; see [`fixed_rate`]) in `--repeat` rounds that alternate
//! which setting goes first: the decision log's cost at p99 at equal load, as the
//! ratio of the median p99s (one run's p99 varies by tens of percent on a small VM),
//! and as the median ratio of runs made back to back, each with a distribution-free
//! interval; and the server's CPU per request read from `/proc`.
//! Nothing here asserts on time.

mod cpu;
mod dense;
mod load;
mod report;
mod server;
mod wrk;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::fixed_rate;
use load::{Bodies, request_bodies};
pub use load::{LoadArgs, load};
use report::{
    CPU_PER_REQUEST, Measure, P99, print_log_cost, print_median_log_cost, print_paired_log_cost,
};
use server::{Server, file_system_of, loadout};
use wrk::{Scripts, write_scripts, wrk};

/// The fixed-rate runs offer this share of the lower saturated rate of the two
/// decision-log settings, unless `--share` says otherwise.
const FIXED_RATE_SHARE: f64 = 0.5;

const MESSAGES: &[&str] = &[
    "what time is it in Seoul",
    "remember that my parrot is called Polly",
    "read the file notes.txt in my documents folder",
    "create a table of my expenses with date and amount",
    "calculate 17% of 2,340",
    "what do you remember about my trip to Busan",
];

/// `cargo xtask bench-route`'s options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The loadout binary; build it with `cargo build --release -p loadout-server`.
    #[arg(long, value_name = "PATH", default_value = "target/release/loadout")]
    bin: PathBuf,
    /// Also run against this PostgreSQL database (its tables are created if missing;
    /// rows are added).
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// Seconds per wrk run.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    duration: u64,
    /// wrk connections.
    #[arg(long, value_name = "N", default_value_t = 32)]
    connections: u32,
    /// Fixed-rate rounds per decision-log setting, alternating which goes first; the
    /// reported p99 is their median.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = positive)]
    repeat: usize,
    /// The fixed rate, as a share of the lower saturated rate; the log's cost at p99
    /// grows with the load the cores carry.
    #[arg(long, value_name = "F", default_value_t = FIXED_RATE_SHARE, value_parser = share)]
    share: f64,
    /// Start the `plain` server with the log off too: an A/A run, whose on/off ratios
    /// are the harness's own bias and noise.
    #[arg(long)]
    both_off: bool,
    /// Also route with the dense stage (the built-in encoder) on SQLite, saturated,
    /// with a cheap GET beside it: what the encoder costs per request and whether it
    /// holds up the rest of the server.
    #[arg(long)]
    dense: bool,
}

/// `--repeat`: at least one round.
fn positive(text: &str) -> Result<usize, String> {
    text.parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| "not a positive number".to_owned())
}

/// `--share`: a share of the saturated rate, above 0 and at most all of it.
fn share(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|&f| f > 0.0 && f <= 1.0)
        .ok_or_else(|| "not a share in (0, 1]".to_owned())
}

/// One backend's runs: the options, the scratch dir its servers' data dirs are in and
/// the database they use (`None`: SQLite in the data dir).
struct Backend<'a> {
    args: &'a Args,
    scripts: &'a Scripts,
    scratch: &'a Path,
    name: &'a str,
    url: Option<&'a str>,
}

/// A fixed-rate run: the log setting, the kind of requests, the load's figures and
/// the server's CPU per request.
type Sample = (
    &'static str,
    &'static str,
    fixed_rate::FixedRate,
    cpu::PerRequest,
);

/// Per kind of request and measure, each round's on/off ratio.
type Paired = (&'static str, &'static Measure, Vec<f64>);

pub fn run(args: &Args) -> anyhow::Result<()> {
    if !args.bin.exists() {
        bail!(
            "{} does not exist: cargo build --release -p loadout-server",
            args.bin.display()
        );
    }
    if Command::new("wrk").arg("--version").output().is_err() {
        bail!("wrk is missing: apt-get install -y wrk");
    }
    let scratch = std::env::temp_dir().join(format!("loadout-bench-route-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let scripts = write_scripts(&scratch)?;
    let bodies = request_bodies();
    print_header(args, &scratch);
    let mut backends: Vec<(&str, Option<&str>)> = vec![("sqlite", None)];
    if let Some(url) = &args.postgres {
        backends.push(("postgresql", Some(url.as_str())));
    }
    for (name, url) in backends {
        let backend = Backend {
            args,
            scripts: &scripts,
            scratch: &scratch,
            name,
            url,
        };
        let saturated = saturated(&backend)?;
        let (samples, paired) = fixed_rate_rounds(&backend, &bodies, &saturated)?;
        print_fixed_rate(&backend, &samples, &paired);
    }
    if args.dense {
        dense::bench_dense(args, &scripts, &scratch)?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// The run's conditions: cores, wrk's settings, where the data dirs are, the build.
fn print_header(options: &Args, scratch: &Path) {
    println!(
        "# /api/route, lexical routing; {} cores; wrk 1 thread, {} connections, {} s per run; {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        options.connections,
        options.duration,
        options.bin.display()
    );
    println!(
        "{:<11} {:<13} {:<11} {:>10} {:>9} {:>9} {:>7}",
        "backend", "decision_log", "requests", "req/s", "p50 ms", "p99 ms", "errors"
    );
    if options.both_off {
        println!(
            "# --both-off: the `plain` server logs nothing either; every on/off ratio below compares two servers set alike"
        );
    }
    // On a disk, SQLite's `fsync`s at checkpoints are what session requests' p99
    // measures (2 to 26 ms), whatever the decision log does.
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    match file_system_of(scratch, &mounts) {
        Some(fs) if fs == "tmpfs" => println!("# data dirs on tmpfs ({})", scratch.display()),
        Some(fs) => println!(
            "# data dirs on {fs}, not tmpfs ({}): p99 includes fsync; TMPDIR=/dev/shm runs on tmpfs",
            scratch.display()
        ),
        None => println!("# data dirs in {}", scratch.display()),
    }
    // The fixed-rate load runs in this process and shares the cores with the
    // server: built in debug, it took as many CPU samples as the server it loaded
    // (`perf`, 2 cores), and log-off rounds' p99 spread over 0.8-4.1 ms against
    // 0.6-2.3 ms with a release build.
    if cfg!(debug_assertions) {
        println!(
            "# the fixed-rate load generator is a debug build and takes about as much CPU as the server; `cargo run --release -p xtask -- bench-route` loads with less"
        );
    }
}

/// Both log settings' servers saturated by wrk, one-off and session requests: each
/// run's `(log, requests, p99 ms, requests/s)`, after the on/off cost lines.
fn saturated(backend: &Backend<'_>) -> anyhow::Result<Vec<(&'static str, &'static str, f64, f64)>> {
    let Backend {
        args: options,
        scripts,
        scratch,
        name: backend,
        url,
    } = *backend;
    let mut p99 = Vec::new();
    for log in ["plain", "off"] {
        let data_dir = scratch.join(format!("{backend}-{log}"));
        std::fs::create_dir_all(&data_dir)?;
        let setting = if options.both_off { "off" } else { log };
        for (key, value) in [("router_dense", "off"), ("decision_log", setting)] {
            let status = loadout(&options.bin, &data_dir, url)
                .args(["settings", "set", key, value])
                .stdout(Stdio::null())
                .status()
                .context("running loadout settings set")?;
            if !status.success() {
                bail!("loadout settings set {key} {value} failed ({backend})");
            }
        }
        let server = Server::start(&options.bin, &data_dir, url)?;
        let endpoint = format!("http://{}/api/route", server.addr);
        wrk(&scripts.plain, &endpoint, 4, 2)?;
        for (requests, script) in [("one-off", &scripts.plain), ("session", &scripts.session)] {
            let load = wrk(script, &endpoint, options.connections, options.duration)?;
            println!(
                "{backend:<11} {log:<13} {requests:<11} {:>10.0} {:>9.2} {:>9.2} {:>7}",
                load.requests_per_s, load.p50_ms, load.p99_ms, load.errors
            );
            p99.push((log, requests, load.p99_ms, load.requests_per_s));
        }
        drop(server);
    }
    let saturated: Vec<_> = p99.iter().map(|&(l, r, ms, _)| (l, r, ms)).collect();
    print_log_cost(backend, "saturated", &P99, &saturated);
    Ok(p99)
}

/// The fixed-rate rounds, both settings' servers up throughout: every run's sample,
/// and per kind of request the rounds' paired on/off ratios.
fn fixed_rate_rounds(
    backend: &Backend<'_>,
    bodies: &Bodies,
    saturated: &[(&str, &str, f64, f64)],
) -> anyhow::Result<(Vec<Sample>, Vec<Paired>)> {
    let (options, name) = (backend.args, backend.name);
    // The same load for both settings, below saturation: by default half the lower of the
    // two saturated rates, per kind of request.
    let rate_for = |requests: &str| {
        saturated
            .iter()
            .filter(|(_, r, _, _)| *r == requests)
            .map(|(_, _, _, rps)| *rps)
            .fold(f64::INFINITY, f64::min)
            * options.share
    };
    // Both settings' servers stay up for every round, and each kind of request is
    // run with the log on and off back to back, alternating which goes first: the
    // two runs of a pair share the machine's spell, fast or slow, so their ratio
    // is measured against the other's noise of the same moment, not of minutes
    // before. One idle server costs the other nothing.
    //
    // Which server started first matters by itself: with the log off in both
    // (`--both-off`), session requests' p99 came out 1.51x on the first-started
    // server over 12 rounds, and 1.14x with the start order swapped. So half way
    // through, both servers are started again in the other order.
    let mut servers = start_pair(backend, false)?;
    let mut samples: Vec<Sample> = Vec::new();
    // Per kind of request, each round's on/off ratio of p99 and of CPU per request.
    let mut paired: Vec<Paired> = Vec::new();
    for round in 0..options.repeat {
        if round == options.repeat / 2 && round > 0 {
            drop(servers);
            servers = start_pair(backend, true)?;
        }
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for (requests, bodies) in [("one-off", &bodies.plain), ("session", &bodies.session)] {
            let rate = rate_for(requests);
            if !rate.is_finite() || rate < 1.0 {
                continue;
            }
            let mut pair = [None, None];
            for i in order {
                let (log, server) = &servers[i];
                let before = cpu::Usage::of(server.child.id());
                let load = fixed_rate::run(
                    &server.addr,
                    "/api/route",
                    bodies,
                    rate,
                    options.connections as usize,
                    Duration::from_secs(options.duration),
                )?;
                let used = cpu::Usage::of(server.child.id()).since(&before);
                let per_request = used.per_request(load.latencies.len());
                println!(
                    "{name:<11} {log:<13} {:<11} {:>10.0} {:>9.2} {:>9.2} {:>7}  cpu {}",
                    format!("{requests}@{rate:.0}"),
                    load.achieved_per_s,
                    load.p50_ms,
                    load.p99_ms,
                    load.errors,
                    per_request.describe()
                );
                pair[i] = Some((load.p99_ms, per_request.total_us));
                samples.push((*log, requests, load, per_request));
            }
            if let [Some((p99_on, cpu_on)), Some((p99_off, cpu_off))] = pair {
                let mut push = |measure: &'static Measure, ratio: f64| match paired
                    .iter_mut()
                    .find(|(r, m, _)| *r == requests && std::ptr::eq(*m, measure))
                {
                    Some((_, _, ratios)) => ratios.push(ratio),
                    None => paired.push((requests, measure, vec![ratio])),
                };
                push(&P99, p99_on / p99_off.max(1e-9));
                if let (Some(on), Some(off)) = (cpu_on, cpu_off) {
                    push(&CPU_PER_REQUEST, on / off.max(1e-9));
                }
            }
        }
    }
    drop(servers);
    Ok((samples, paired))
}

/// The fixed-rate rounds summed up: each setting's spread, and the log's cost as the
/// ratio of medians, of pooled p99s, of CPU per request and paired by round.
fn print_fixed_rate(backend: &Backend<'_>, samples: &[Sample], paired: &[Paired]) {
    let (options, backend) = (backend.args, backend.name);
    let mut p99_rounds = Vec::new();
    let mut pooled = Vec::new();
    let mut cpu_rounds = Vec::new();
    for log in ["plain", "off"] {
        for requests in ["one-off", "session"] {
            let (rounds, cpu): (Vec<&fixed_rate::FixedRate>, Vec<&cpu::PerRequest>) = samples
                .iter()
                .filter(|(l, r, _, _)| *l == log && *r == requests)
                .map(|(_, _, load, cpu)| (load, cpu))
                .unzip();
            if rounds.is_empty() {
                continue;
            }
            let cpu_us: Vec<f64> = cpu.iter().filter_map(|cpu| cpu.total_us).collect();
            if !cpu_us.is_empty() {
                cpu_rounds.push((log, requests, cpu_us));
            }
            let mut p99: Vec<f64> = rounds.iter().map(|load| load.p99_ms).collect();
            p99.sort_by(f64::total_cmp);
            let mut all: Vec<Duration> = rounds
                .iter()
                .flat_map(|load| load.latencies.iter().copied())
                .collect();
            all.sort_unstable();
            pooled.push((log, requests, fixed_rate::quantile_ms(&all, 0.99)));
            if log == "off" {
                println!(
                    "{backend}: log off, {requests}: rounds' p99 from {:.2} to {:.2} ms (the machine's noise)",
                    p99[0],
                    p99[p99.len() - 1]
                );
            }
            p99_rounds.push((log, requests, p99));
        }
    }
    let median_of = format!("fixed rate, median of {}", options.repeat);
    print_median_log_cost(backend, &median_of, &P99, &p99_rounds);
    let pooled_over = format!("fixed rate, pooled over {}", options.repeat);
    print_log_cost(backend, &pooled_over, &P99, &pooled);
    print_median_log_cost(backend, &median_of, &CPU_PER_REQUEST, &cpu_rounds);
    print_paired_log_cost(backend, options.repeat, paired);
}

/// The fixed-rate rounds' two servers, `plain` first in the result; started (and
/// warmed up) in that order, or `off` first when `reversed`.
fn start_pair(
    backend: &Backend<'_>,
    reversed: bool,
) -> anyhow::Result<Vec<(&'static str, Server)>> {
    let Backend {
        args: options,
        scripts,
        scratch,
        name: backend,
        url,
    } = *backend;
    let mut order = ["plain", "off"];
    if reversed {
        order.reverse();
    }
    let mut servers = Vec::new();
    for log in order {
        let data_dir = scratch.join(format!("{backend}-{log}"));
        let server = Server::start(&options.bin, &data_dir, url)?;
        wrk(
            &scripts.plain,
            &format!("http://{}/api/route", server.addr),
            4,
            2,
        )?;
        servers.push((log, server));
    }
    servers.sort_by_key(|(log, _)| *log != "plain");
    println!(
        "# fixed-rate servers started, {} first",
        if reversed { "log off" } else { "log on" }
    );
    Ok(servers)
}
