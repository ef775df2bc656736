//! `wrk` at saturation: the Lua scripts that send the benchmark's messages and print
//! one result line, and that line read back.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use super::MESSAGES;

/// One wrk run's figures.
pub(super) struct Load {
    pub(super) requests_per_s: f64,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) errors: u64,
}

/// The wrk scripts, written once into the scratch dir.
pub(super) struct Scripts {
    pub(super) plain: PathBuf,
    pub(super) session: PathBuf,
    /// `GET` of whatever URL wrk is given, with the same result line.
    pub(super) get: PathBuf,
}

pub(super) fn write_scripts(dir: &Path) -> anyhow::Result<Scripts> {
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

/// One wrk run of `seconds` with one thread and `connections` connections.
pub(super) fn wrk(
    script: &Path,
    url: &str,
    connections: u32,
    seconds: u64,
) -> anyhow::Result<Load> {
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
