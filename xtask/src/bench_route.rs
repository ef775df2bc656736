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

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::fixed_rate;

/// The fixed-rate runs offer this share of the lower saturated rate of the two
/// decision-log settings, unless `--share` says otherwise.
const FIXED_RATE_SHARE: f64 = 0.5;

const USAGE: &str = "usage: cargo xtask bench-route [--bin PATH] [--postgres URL] [--duration SECONDS] [--connections N] [--repeat N] [--share F] [--both-off] [--dense]
  --bin          the loadout binary (default target/release/loadout; build it with
                 `cargo build --release -p loadout-server`)
  --postgres     also run against this PostgreSQL database (its tables are created
                 if missing; rows are added)
  --duration     seconds per wrk run (default 10)
  --connections  wrk connections (default 32)
  --repeat       fixed-rate rounds per decision-log setting, alternating which goes
                 first; the reported p99 is their median (default 3)
  --share        the fixed rate, as a share of the lower saturated rate (default
                 0.5); the log's cost at p99 grows with the load the cores carry
  --both-off     start the `plain` server with the log off too: an A/A run, whose
                 on/off ratios are the harness's own bias and noise
  --dense        also route with the dense stage (the built-in encoder) on SQLite,
                 saturated, with a cheap GET beside it: what the encoder costs per
                 request and whether it holds up the rest of the server";

const MESSAGES: &[&str] = &[
    "what time is it in Seoul",
    "remember that my parrot is called Polly",
    "read the file notes.txt in my documents folder",
    "create a table of my expenses with date and amount",
    "calculate 17% of 2,340",
    "what do you remember about my trip to Busan",
];

struct Options {
    bin: PathBuf,
    postgres: Option<String>,
    duration: u64,
    connections: u32,
    repeat: usize,
    share: f64,
    both_off: bool,
    dense: bool,
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        bin: PathBuf::from("target/release/loadout"),
        postgres: None,
        duration: 10,
        connections: 32,
        repeat: 3,
        share: FIXED_RATE_SHARE,
        both_off: false,
        dense: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .cloned()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--bin" => options.bin = PathBuf::from(value("--bin")?),
            "--postgres" => options.postgres = Some(value("--postgres")?),
            "--duration" => {
                let text = value("--duration")?;
                options.duration = text
                    .parse()
                    .with_context(|| format!("--duration {text}: not a number"))?;
            }
            "--connections" => {
                let text = value("--connections")?;
                options.connections = text
                    .parse()
                    .with_context(|| format!("--connections {text}: not a number"))?;
            }
            "--repeat" => {
                let text = value("--repeat")?;
                options.repeat = text
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .with_context(|| format!("--repeat {text}: not a positive number"))?;
            }
            "--share" => {
                let text = value("--share")?;
                options.share = text
                    .parse::<f64>()
                    .ok()
                    .filter(|&f| f > 0.0 && f <= 1.0)
                    .with_context(|| format!("--share {text}: not a share in (0, 1]"))?;
            }
            "--both-off" => options.both_off = true,
            "--dense" => options.dense = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    Ok(options)
}

/// One wrk run's figures.
struct Load {
    requests_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = parse_args(args)?;
    if !options.bin.exists() {
        bail!(
            "{} does not exist: cargo build --release -p loadout-server",
            options.bin.display()
        );
    }
    if Command::new("wrk").arg("--version").output().is_err() {
        bail!("wrk is missing: apt-get install -y wrk");
    }
    let scratch = std::env::temp_dir().join(format!("loadout-bench-route-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let scripts = write_scripts(&scratch)?;
    let bodies = request_bodies();

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
    match file_system_of(&scratch, &mounts) {
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
    let mut backends: Vec<(&str, Option<&str>)> = vec![("sqlite", None)];
    if let Some(url) = &options.postgres {
        backends.push(("postgresql", Some(url.as_str())));
    }
    for (backend, url) in backends {
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

        // The same load for both settings, below saturation: by default half the lower of the
        // two saturated rates, per kind of request.
        let rate_for = |requests: &str| {
            p99.iter()
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
        let mut servers = start_pair(&options, &scripts, &scratch, backend, url, false)?;
        let mut samples: Vec<(&str, &str, fixed_rate::FixedRate, cpu::PerRequest)> = Vec::new();
        // Per kind of request, each round's on/off ratio of p99 and of CPU per request.
        let mut paired: Vec<(&str, &Measure, Vec<f64>)> = Vec::new();
        for round in 0..options.repeat {
            if round == options.repeat / 2 && round > 0 {
                drop(servers);
                servers = start_pair(&options, &scripts, &scratch, backend, url, true)?;
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
                        "{backend:<11} {log:<13} {:<11} {:>10.0} {:>9.2} {:>9.2} {:>7}  cpu {}",
                        format!("{requests}@{rate:.0}"),
                        load.achieved_per_s,
                        load.p50_ms,
                        load.p99_ms,
                        load.errors,
                        per_request.describe()
                    );
                    pair[i] = Some((load.p99_ms, per_request.total_us));
                    samples.push((log, requests, load, per_request));
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
        print_paired_log_cost(backend, options.repeat, &paired);
    }
    if options.dense {
        bench_dense(&options, &scripts, &scratch)?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// `--dense`: the same saturated runs with the built-in encoder on (SQLite, decision
/// log on), and, beside the one-off load, one connection asking `GET /api/domains`
/// (no routing): its latency says whether encoding holds up requests that do not
/// need it.
fn bench_dense(options: &Options, scripts: &Scripts, scratch: &Path) -> anyhow::Result<()> {
    let data_dir = scratch.join("sqlite-dense");
    std::fs::create_dir_all(&data_dir)?;
    let server = Server::start(&options.bin, &data_dir, None)?;
    // Tool vectors are computed in the background after start; until then routing
    // is lexical and its notes say so.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let answer = post_once(
            &server.addr,
            "/api/route",
            r#"{"message": "what's it like outside"}"#,
        )?;
        if answer.contains("dense stage off") {
            bail!("the dense stage did not start: {answer}");
        }
        if !answer.contains("dense stage not ready") {
            break;
        }
        if Instant::now() > deadline {
            bail!("the dense stage was not ready within 120 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let endpoint = format!("http://{}/api/route", server.addr);
    wrk(&scripts.plain, &endpoint, 4, 2)?;
    println!("\n# dense stage on (built-in encoder), SQLite, decision log on, saturated");
    for (requests, script) in [("one-off", &scripts.plain), ("session", &scripts.session)] {
        let beside = (requests == "one-off").then(|| {
            let url = format!("http://{}/api/domains", server.addr);
            let (get, seconds) = (scripts.get.clone(), options.duration);
            std::thread::spawn(move || wrk(&get, &url, 1, seconds))
        });
        let load = wrk(script, &endpoint, options.connections, options.duration)?;
        println!(
            "{:<11} {:<13} {:<11} {:>10.0} {:>9.2} {:>9.2} {:>7}",
            "sqlite",
            "plain",
            format!("{requests}+dense"),
            load.requests_per_s,
            load.p50_ms,
            load.p99_ms,
            load.errors
        );
        if let Some(beside) = beside {
            let get = beside
                .join()
                .map_err(|_| anyhow::anyhow!("the GET load's thread panicked"))??;
            println!(
                "  GET /api/domains beside it (1 connection): {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms",
                get.requests_per_s, get.p50_ms, get.p99_ms
            );
        }
    }
    Ok(())
}

/// One request on a connection of its own; the answer's body.
fn post_once(addr: &str, path: &str, body: &str) -> anyhow::Result<String> {
    use std::io::Read as _;
    let mut stream =
        std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// What a measure is and its unit, for the log-cost lines.
struct Measure {
    what: &'static str,
    unit: &'static str,
}

const P99: Measure = Measure {
    what: "at p99",
    unit: "ms",
};
/// The server's CPU time per request: unlike p99 it barely moves from one run to
/// the next, so it says how much of the p99 ratio is work the log adds rather than
/// noise.
const CPU_PER_REQUEST: Measure = Measure {
    what: "in server CPU per request",
    unit: "us",
};

/// The decision log's cost per kind of request: `(log, requests, value)` rows with
/// `plain` and `off` for the same kind give one ratio line.
fn print_log_cost(backend: &str, load: &str, measure: &Measure, values: &[(&str, &str, f64)]) {
    for requests in ["one-off", "session"] {
        let of = |log: &str| {
            values
                .iter()
                .find(|(l, r, _)| *l == log && *r == requests)
                .map(|(_, _, value)| *value)
        };
        if let (Some(on), Some(off)) = (of("plain"), of("off")) {
            let Measure { what, unit } = measure;
            println!(
                "{backend}: decision log on/off {what}, {requests}, {load}: {:.2}x ({on:.2} {unit} vs {off:.2} {unit})",
                on / off.max(1e-6)
            );
        }
    }
}

/// [`print_log_cost`] for the median of the rounds, with how sure that ratio is:
/// its 95 % interval ([`median_ratio_interval`]).
/// Two runs' medians differ by more than the log's cost on a small machine; the
/// interval says which differences a run can tell apart from that.
fn print_median_log_cost(
    backend: &str,
    load: &str,
    measure: &Measure,
    rounds: &[(&str, &str, Vec<f64>)],
) {
    for requests in ["one-off", "session"] {
        let of = |log: &str| {
            rounds
                .iter()
                .find(|(l, r, _)| *l == log && *r == requests)
                .map(|(_, _, values)| values.as_slice())
        };
        let (Some(on), Some(off)) = (of("plain"), of("off")) else {
            continue;
        };
        let (Some(on_median), Some(off_median)) = (median(on), median(off)) else {
            continue;
        };
        let Measure { what, unit } = measure;
        let sureness = sureness(median_ratio_interval(on, off), 7);
        println!(
            "{backend}: decision log on/off {what}, {requests}, {load}: {:.2}x ({on_median:.2} {unit} vs {off_median:.2} {unit}{sureness})",
            on_median / off_median.max(1e-6)
        );
    }
}

/// The log's cost from pairs of runs made back to back: the median of the rounds'
/// on/off ratios, with its distribution-free 95 % interval ([`median_interval`]).
/// Pairing takes out what drifts between
/// rounds (the machine's slow and fast spells), which the medians of the two
/// settings' rounds ([`print_median_log_cost`]) keep: the same rounds give a narrower
/// interval, narrower still with more of them (with 8 rounds it runs from the
/// smallest ratio to the largest, with 40 from the 14th to the 27th).
fn print_paired_log_cost(backend: &str, rounds: usize, paired: &[(&str, &Measure, Vec<f64>)]) {
    for (requests, measure, ratios) in paired {
        let Some(ratio) = median(ratios) else {
            continue;
        };
        let Measure { what, .. } = measure;
        let sureness = sureness(median_interval(ratios, 0.95), 6);
        println!(
            "{backend}: decision log on/off {what}, {requests}, fixed rate, paired over {rounds} rounds: median ratio {ratio:.2}x{sureness}"
        );
    }
}

/// `; 95 % interval LOWx-HIGHx`, or, with no interval, how many rounds one needs.
fn sureness(interval: Option<(f64, f64)>, min_rounds: usize) -> String {
    match interval {
        Some((low, high)) => format!("; 95 % interval {low:.2}x-{high:.2}x"),
        None => format!("; too few rounds for a 95 % interval: {min_rounds} or more"),
    }
}

/// The upper median, as the rounds' summaries have always taken it.
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied()
}

/// A 95 % interval for `median(on) / median(off)` that assumes nothing about how
/// rounds vary: each median's distribution-free 97.5 % interval
/// ([`median_interval`]), and the ratio from their ends (both hold together with
/// at least 95 %). A percentile bootstrap of a median from 8 rounds was tried first:
/// it came out narrow and contradicted itself from one run to the next (one run
/// "within" the target at 0.53x-0.92x, the next "over" it). `None` when there are too
/// few rounds for the confidence.
fn median_ratio_interval(on: &[f64], off: &[f64]) -> Option<(f64, f64)> {
    let (on_low, on_high) = median_interval(on, 0.975)?;
    let (off_low, off_high) = median_interval(off, 0.975)?;
    Some((on_low / off_high.max(1e-9), on_high / off_low.max(1e-9)))
}

/// The interval between the k-th smallest and k-th largest of `values`, with the
/// largest k for which it holds the median with at least `confidence` (whatever the
/// values' distribution: each value is below the median with probability 1/2). With
/// 8 rounds and 97.5 % that is the smallest and the largest; 3 rounds are too few.
fn median_interval(values: &[f64], confidence: f64) -> Option<(f64, f64)> {
    let n = values.len();
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    // P(Binomial(n, 1/2) <= j), for j = 0, 1, ...
    let mut below = 0.0;
    let mut choose = 1.0;
    let mut k = 0;
    for j in 0..n / 2 {
        if j > 0 {
            choose = choose * (n - j + 1) as f64 / j as f64;
        }
        below += choose * 0.5f64.powi(n as i32);
        // [x(j+1), x(n-j)] misses the median with probability 2 * P(Bin <= j).
        if 1.0 - 2.0 * below < confidence {
            break;
        }
        k = j + 1;
    }
    (k > 0).then(|| (sorted[k - 1], sorted[n - k]))
}

fn loadout(bin: &Path, data_dir: &Path, url: Option<&str>) -> Command {
    let mut command = Command::new(bin);
    command.env("LOADOUT_DATA_DIR", data_dir);
    command.env("LOADOUT_LOG", "warn");
    match url {
        Some(url) => command.env("LOADOUT_DATABASE_URL", url),
        None => command.env_remove("LOADOUT_DATABASE_URL"),
    };
    command
}

/// A `loadout serve` child on a free loopback port, killed on drop.
struct Server {
    child: Child,
    addr: String,
}

/// The type of the file system that holds `path` (the mount point of `mounts`, in
/// `/proc/mounts`' format, that is the longest prefix of it); `None` if no line says.
fn file_system_of(path: &Path, mounts: &str) -> Option<String> {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _device = fields.next()?;
            // The kernel writes a space in a mount point as `\040`.
            let mount_point = PathBuf::from(fields.next()?.replace("\\040", " "));
            let fs = fields.next()?;
            path.starts_with(&mount_point)
                .then(|| (mount_point.components().count(), fs.to_owned()))
        })
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, fs)| fs)
}

/// The fixed-rate rounds' two servers, `plain` first in the result; started (and
/// warmed up) in that order, or `off` first when `reversed`.
fn start_pair(
    options: &Options,
    scripts: &Scripts,
    scratch: &Path,
    backend: &str,
    url: Option<&str>,
    reversed: bool,
) -> anyhow::Result<Vec<(&'static str, Server)>> {
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

impl Server {
    fn start(bin: &Path, data_dir: &Path, url: Option<&str>) -> anyhow::Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = loadout(bin, data_dir, url)
            .args(["serve", "--addr", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting loadout serve")?;
        let server = Server { child, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&server.addr).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "loadout serve did not listen on {} within 30 s",
                    server.addr
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The request bodies of the fixed-rate runs, in the order the wrk scripts send them.
struct Bodies {
    plain: Vec<String>,
    session: Vec<String>,
}

fn request_bodies() -> Bodies {
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

struct Scripts {
    plain: PathBuf,
    session: PathBuf,
    /// `GET` of whatever URL wrk is given, with the same result line.
    get: PathBuf,
}

fn write_scripts(dir: &Path) -> anyhow::Result<Scripts> {
    let messages = MESSAGES
        .iter()
        .map(|m| format!("{m:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let common = format!(
        r#"local messages = {{ {messages} }}
local counter = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
function done(summary, latency, requests)
  local errors = summary.errors.status + summary.errors.connect + summary.errors.read
    + summary.errors.write + summary.errors.timeout
  io.write(string.format("RESULT %.1f %.3f %.3f %d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, errors))
end
"#
    );
    let plain = dir.join("plain.lua");
    let mut file = std::fs::File::create(&plain)?;
    write!(
        file,
        r#"{common}
function request()
  counter = counter + 1
  return wrk.format(nil, nil, nil, string.format('{{"message": "%s"}}', messages[counter % #messages + 1]))
end
"#
    )?;
    let session = dir.join("session.lua");
    let mut file = std::fs::File::create(&session)?;
    write!(
        file,
        r#"{common}
function request()
  counter = counter + 1
  return wrk.format(nil, nil, nil, string.format('{{"session": "bench-%d", "message": "%s"}}',
    counter % 64, messages[counter % #messages + 1]))
end
"#
    )?;
    let get = dir.join("get.lua");
    std::fs::write(
        &get,
        common.replace(r#"wrk.method = "POST""#, r#"wrk.method = "GET""#),
    )?;
    Ok(Scripts {
        plain,
        session,
        get,
    })
}

fn wrk(script: &Path, url: &str, connections: u32, seconds: u64) -> anyhow::Result<Load> {
    let output = Command::new("wrk")
        .args(["-t1", &format!("-c{connections}"), &format!("-d{seconds}s")])
        .arg("-s")
        .arg(script)
        .arg(url)
        .output()
        .context("running wrk")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .with_context(|| format!("wrk printed no result: {stdout}"))?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| -> anyhow::Result<f64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("wrk result `{line}`"))
    };
    Ok(Load {
        requests_per_s: number(0)?,
        p50_ms: number(1)?,
        p99_ms: number(2)?,
        errors: number(3)? as u64,
    })
}

/// `cargo xtask load --addr HOST:PORT --rate N [--duration S] [--connections N]
/// [--session | --distinct]`: the fixed-rate load of `bench-route` against a server
/// that is already running, for profiling it (e.g. under `perf`) one setting at a
/// time. `--distinct` numbers every message, so that none is in the server's cache
/// of message vectors: the dense stage's encoder runs for each.
pub fn load(args: &[String]) -> anyhow::Result<()> {
    const LOAD_USAGE: &str = "usage: cargo xtask load --addr HOST:PORT --rate N [--duration S] [--connections N] [--session | --distinct]";
    let mut addr = None;
    let mut rate = None;
    let mut duration = 10u64;
    let mut connections = 32usize;
    let mut session = false;
    let mut distinct = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{arg} needs a value\n{LOAD_USAGE}"))
        };
        match arg.as_str() {
            "--addr" => addr = Some(value()?.clone()),
            "--rate" => rate = Some(value()?.parse::<f64>().context("--rate")?),
            "--duration" => duration = value()?.parse().context("--duration")?,
            "--connections" => connections = value()?.parse().context("--connections")?,
            "--session" => session = true,
            "--distinct" => distinct = true,
            other => bail!("unknown option `{other}`\n{LOAD_USAGE}"),
        }
    }
    let (Some(addr), Some(rate)) = (addr, rate) else {
        bail!("{LOAD_USAGE}");
    };
    let bodies = request_bodies();
    let numbered: Vec<String>;
    let bodies = if session {
        &bodies.session
    } else if distinct {
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
    let stride = if distinct { connections } else { 1 };
    let load = fixed_rate::run_strided(
        &addr,
        "/api/route",
        bodies,
        rate,
        connections,
        Duration::from_secs(duration),
        stride,
    )?;
    println!(
        "{:.0} req/s  p50 {:.2} ms  p99 {:.2} ms  errors {}",
        load.achieved_per_s, load.p50_ms, load.p99_ms, load.errors
    );
    Ok(())
}

/// The server's CPU time, from `/proc` (Linux; elsewhere nothing is measured).
mod cpu {
    /// `/proc` counts CPU time in clock ticks of 1/USER_HZ s; USER_HZ is 100 on every
    /// Linux architecture that exposes it to user space.
    const TICK_US: f64 = 10_000.0;

    /// Name of the SQLite log thread as `/proc` shows it (cut to 15 bytes; the
    /// request connection's thread is `loadout-db`).
    const LOG_THREAD: &str = "loadout-sqlite";

    /// CPU ticks used so far by a process, in all and by its SQLite log thread.
    pub struct Usage {
        total: Option<u64>,
        /// `None` when the process's threads could not be listed.
        log_thread: Option<u64>,
    }

    impl Usage {
        pub fn of(pid: u32) -> Usage {
            let total = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| ticks(&stat));
            let log_thread = std::fs::read_dir(format!("/proc/{pid}/task"))
                .ok()
                .map(|tasks| {
                    tasks
                        .flatten()
                        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
                        .filter(|stat| thread_name(stat).is_some_and(|n| n.starts_with(LOG_THREAD)))
                        .filter_map(|stat| ticks(&stat))
                        .sum()
                });
            Usage { total, log_thread }
        }

        /// The ticks used between `before` and now.
        pub fn since(&self, before: &Usage) -> Usage {
            let since = |now: Option<u64>, then: Option<u64>| {
                now.zip(then).map(|(now, then)| now.saturating_sub(then))
            };
            Usage {
                total: since(self.total, before.total),
                log_thread: since(self.log_thread, before.log_thread),
            }
        }

        pub fn per_request(&self, requests: usize) -> PerRequest {
            let per = |ticks: u64| (requests > 0).then(|| ticks as f64 * TICK_US / requests as f64);
            PerRequest {
                total_us: self.total.and_then(per),
                log_thread_us: self.log_thread.and_then(per),
            }
        }
    }

    /// Server CPU microseconds per answered request.
    pub struct PerRequest {
        pub total_us: Option<f64>,
        /// Of which the SQLite log thread's.
        pub log_thread_us: Option<f64>,
    }

    impl PerRequest {
        pub fn describe(&self) -> String {
            match (self.total_us, self.log_thread_us) {
                (Some(total), Some(log)) if log > 0.0 => {
                    format!("{total:.1} us/req ({log:.1} on the log thread)")
                }
                (Some(total), _) => format!("{total:.1} us/req"),
                (None, _) => "unmeasured".into(),
            }
        }
    }

    /// `utime + stime` from a `stat` line. The command name may hold spaces and
    /// parentheses, so fields are counted from the last `)`.
    fn ticks(stat: &str) -> Option<u64> {
        let rest = &stat[stat.rfind(')')? + 1..];
        let mut fields = rest.split_whitespace();
        // After the name: state is field 3; utime and stime are fields 14 and 15.
        let utime: u64 = fields.nth(11)?.parse().ok()?;
        let stime: u64 = fields.next()?.parse().ok()?;
        Some(utime + stime)
    }

    fn thread_name(stat: &str) -> Option<&str> {
        Some(&stat[stat.find('(')? + 1..stat.rfind(')')?])
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn ticks_are_read_after_a_name_with_spaces_and_parentheses() {
            let stat = "42 (a (b) c) S 1 42 42 0 -1 4194304 100 0 0 0 7 5 0 0 20 0 3 0";
            assert_eq!(ticks(stat), Some(12));
            assert_eq!(thread_name(stat), Some("a (b) c"));
            assert_eq!(ticks("42 (x) S 1"), None);
        }

        #[test]
        fn this_process_has_used_some_cpu() {
            // Spins until the kernel has counted a tick (10 ms) or 10 s have gone by:
            // a fixed amount of work can come in under one tick on a fast machine.
            // Opaque to the optimizer at every step: a release build would sum the
            // series in closed form and use no CPU time.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut spin = 0u64;
            let mut usage = Usage::of(std::process::id());
            while usage.total == Some(0) && std::time::Instant::now() < deadline {
                for i in 0..1_000_000u64 {
                    spin = std::hint::black_box(spin.wrapping_add(i * i));
                }
                usage = Usage::of(std::process::id());
            }
            assert!(usage.total.is_some_and(|t| t > 0));
            // The threads were listed; none of a test process is the log thread.
            assert_eq!(usage.log_thread, Some(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_system_is_the_deepest_mount_that_holds_the_path() {
        let mounts = "/dev/vda / ext4 rw 0 0
tmpfs /dev/shm tmpfs rw,nosuid 0 0
proc /proc proc rw 0 0
tmpfs /mnt/with\\040space tmpfs rw 0 0
";
        let fs = |p: &str| file_system_of(Path::new(p), mounts);
        assert_eq!(
            fs("/dev/shm/loadout-bench-route-1").as_deref(),
            Some("tmpfs")
        );
        assert_eq!(fs("/tmp/loadout-bench-route-1").as_deref(), Some("ext4"));
        assert_eq!(fs("/mnt/with space/x").as_deref(), Some("tmpfs"));
        // A path component is not a prefix of a longer one.
        assert_eq!(fs("/dev/shmem/x").as_deref(), Some("ext4"));
        assert_eq!(file_system_of(Path::new("/x"), "garbage\n"), None);
    }

    #[test]
    fn the_interval_holds_the_ratio_and_narrows_as_rounds_agree() {
        let off = [1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.8, 1.0];
        let (low, high) = median_ratio_interval(&off, &off).expect("8 rounds");
        assert!(low < 1.0 && high > 1.0, "{low}-{high}");
        // Rounds that agree: a 20 % cost stands out of them.
        let steady = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01];
        let costly: Vec<f64> = steady.iter().map(|v| v * 1.2).collect();
        let (low, high) = median_ratio_interval(&costly, &steady).expect("8 rounds");
        assert!(low > 1.1 && high < 1.3, "{low}-{high}");
        // Three rounds cannot hold a median with 97.5 %.
        assert_eq!(median_ratio_interval(&costly[..3], &steady[..3]), None);
    }

    #[test]
    fn the_median_interval_widens_to_the_confidence_asked() {
        let values: Vec<f64> = (1..=16).map(f64::from).collect();
        // 16 values: [x(4), x(13)] holds the median with 97.9 %, [x(5), x(12)] 92.3 %.
        assert_eq!(median_interval(&values, 0.95), Some((4.0, 13.0)));
        assert_eq!(median_interval(&values, 0.90), Some((5.0, 12.0)));
        assert_eq!(median_interval(&values[..8], 0.975), Some((1.0, 8.0)));
        assert_eq!(median_interval(&values[..8], 0.90), Some((2.0, 7.0)));
        assert_eq!(median_interval(&values[..3], 0.975), None);
    }

    #[test]
    fn paired_rounds_narrow_the_interval_to_the_middle_ratios() {
        let ratios: Vec<f64> = (1..=40).map(f64::from).collect();
        assert_eq!(median_interval(&ratios, 0.95), Some((14.0, 27.0)));
        assert_eq!(median_interval(&ratios[..6], 0.95), Some((1.0, 6.0)));
        assert_eq!(median_interval(&ratios[..5], 0.95), None);
    }

    #[test]
    fn the_median_is_the_upper_one_and_none_of_nothing() {
        assert_eq!(median(&[3.0, 1.0, 2.0, 4.0]), Some(3.0));
        assert_eq!(median(&[]), None);
    }
}
