//! An open-loop HTTP/1.1 load at a fixed request rate, for `cargo xtask bench-route`.
//!
//! `wrk` measures at saturation, where p99 is mostly queueing: any extra work per
//! request (such as writing the decision log) shows up multiplied. A fixed rate below
//! saturation asks the question the decision-log target is about: at the same load,
//! what does logging add to the latency a client sees?
//!
//! Each connection sends on its own schedule (`connections / rate` apart, staggered),
//! on keep-alive, one request in flight. Latency runs from the time a request was
//! *due*, not from when it was sent, so a stalled server is not hidden by the client
//! waiting for it (coordinated omission).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

/// What one fixed-rate run measured.
pub struct FixedRate {
    /// Requests answered with 200 per second of the run.
    pub achieved_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
    /// Every answered request's latency, sorted, for pooling rounds.
    pub latencies: Vec<Duration>,
}

/// The `q` quantile of sorted latencies, in milliseconds (NaN when empty).
pub fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// Runs `POST path` with `bodies` in turn at `rate` requests/s over `connections`
/// keep-alive connections for `duration`.
pub fn run(
    addr: &str,
    path: &str,
    bodies: &[String],
    rate: f64,
    connections: usize,
    duration: Duration,
) -> anyhow::Result<FixedRate> {
    run_strided(addr, path, bodies, rate, connections, duration, 1)
}

/// [`run`], each connection stepping `stride` bodies at a time from its own first
/// one: with `stride == connections` no two requests send the same body until the
/// bodies run out.
pub fn run_strided(
    addr: &str,
    path: &str,
    bodies: &[String],
    rate: f64,
    connections: usize,
    duration: Duration,
    stride: usize,
) -> anyhow::Result<FixedRate> {
    anyhow::ensure!(
        rate > 0.0 && connections > 0,
        "rate and connections must be > 0"
    );
    let requests: Arc<Vec<Vec<u8>>> = Arc::new(
        bodies
            .iter()
            .map(|body| {
                format!(
                    "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes()
            })
            .collect(),
    );
    anyhow::ensure!(!requests.is_empty(), "no request bodies");
    let interval = Duration::from_secs_f64(connections as f64 / rate);
    let stagger = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + duration;
    let workers: Vec<_> = (0..connections)
        .map(|c| {
            let addr = addr.to_owned();
            let requests = requests.clone();
            std::thread::spawn(move || {
                connection(
                    &addr,
                    &requests,
                    (c, stride),
                    start + stagger * c as u32,
                    interval,
                    end,
                )
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (mut l, e) = worker
            .join()
            .map_err(|_| anyhow::anyhow!("a load connection panicked"))??;
        latencies.append(&mut l);
        errors += e;
    }
    latencies.sort_unstable();
    Ok(FixedRate {
        achieved_per_s: latencies.len() as f64 / duration.as_secs_f64(),
        p50_ms: quantile_ms(&latencies, 0.5),
        p99_ms: quantile_ms(&latencies, 0.99),
        errors,
        latencies,
    })
}

/// One connection's schedule: returns the latency of every answered request and the
/// number of failed ones. A broken connection is reopened.
fn connection(
    addr: &str,
    requests: &[Vec<u8>],
    (index, stride): (usize, usize),
    first: Instant,
    interval: Duration,
    end: Instant,
) -> anyhow::Result<(Vec<Duration>, u64)> {
    let mut latencies = Vec::new();
    let mut errors = 0u64;
    let mut stream: Option<BufReader<TcpStream>> = None;
    let mut due = first;
    let mut n = index;
    while due < end {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if stream.is_none() {
            let tcp = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
            tcp.set_nodelay(true)?;
            stream = Some(BufReader::new(tcp));
        }
        let request = &requests[n % requests.len()];
        n += stride;
        let ok = stream
            .as_mut()
            .is_some_and(|s| exchange(s, request).unwrap_or(false));
        if ok {
            latencies.push(due.elapsed());
        } else {
            errors += 1;
            stream = None;
        }
        due += interval;
    }
    Ok((latencies, errors))
}

/// Sends one request and reads its whole response; `Ok(true)` on a 200.
fn exchange(stream: &mut BufReader<TcpStream>, request: &[u8]) -> std::io::Result<bool> {
    stream.get_mut().write_all(request)?;
    let mut line = String::new();
    stream.read_line(&mut line)?;
    let ok = line.split_whitespace().nth(1) == Some("200");
    let mut length = 0usize;
    loop {
        line.clear();
        if stream.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body)?;
    Ok(ok)
}
