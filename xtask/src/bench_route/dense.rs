//! `bench-route --dense`: routing with the built-in encoder under wrk, and a cheap
//! request beside it.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::Args;
use super::server::Server;
use super::wrk::{Scripts, wrk};

/// `--dense`: the same saturated runs with the built-in encoder on (SQLite, decision
/// log on), and, beside the one-off load, one connection asking `GET /api/domains`
/// (no routing): its latency says whether encoding holds up requests that do not
/// need it.
pub(super) fn bench_dense(options: &Args, scripts: &Scripts, scratch: &Path) -> anyhow::Result<()> {
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
