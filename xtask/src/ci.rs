//! `cargo xtask ci`: the checks every change must pass, in the order `.ci/run` runs
//! them, each phase timed: formatting, clippy, the domain lint, the test suite and
//! the routing eval gate. What the suites need from the machine (PostgreSQL, Python
//! clients, npm servers, a browser) is `.ci/run`'s job; here a suite whose server is
//! missing skips itself, unless `CI=true` (as `.ci/run` sets it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

/// The eval gates: turn recall below these fails CI, a margin under what each set
/// reaches (docs/performance.md). Dev is routed as served (the built-in encoder), each
/// of 5 folds with what the other folds teach; the public sets lexical-only with
/// their history, since encoding 20,000 past messages in CI's debug build takes
/// about a quarter of an hour.
pub const EVAL_GATE: f64 = 0.92;
const METATOOL_GATE: f64 = 0.93;
const SEALTOOLS_GATE: f64 = 0.88;

const USAGE: &str = "usage: cargo xtask ci [--shared DIR] [--skip PHASE,...]
  --shared  the shared material (default ../shared): eval/catalog, eval/dev.jsonl and eval/public
  --skip    phases to leave out, of: fmt, clippy, lint, test, eval";

const PHASES: [&str; 5] = ["fmt", "clippy", "lint", "test", "eval"];

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let mut shared = PathBuf::from("../shared");
    let mut skip: Vec<String> = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--shared" => {
                shared = PathBuf::from(
                    args.next()
                        .with_context(|| format!("--shared needs a directory\n{USAGE}"))?,
                );
            }
            "--skip" => {
                let list = args
                    .next()
                    .with_context(|| format!("--skip needs phases\n{USAGE}"))?;
                for phase in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    if !PHASES.contains(&phase) {
                        bail!("--skip: unknown phase `{phase}`\n{USAGE}");
                    }
                    skip.push(phase.to_owned());
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    let catalog = shared.join("eval/catalog");
    let cases = shared.join("eval/dev.jsonl");
    let wanted = |phase: &str| !skip.iter().any(|s| s == phase);
    if (wanted("lint") || wanted("eval")) && !catalog.is_dir() {
        bail!(
            "{} is missing: pass --shared DIR, or --skip lint,eval",
            catalog.display()
        );
    }

    let started = Instant::now();
    let phase = |name: &str, run: &mut dyn FnMut() -> anyhow::Result<()>| {
        if !wanted(name) {
            println!("::: phase {name} skipped");
            return Ok(());
        }
        let t0 = Instant::now();
        println!("::: phase {name}");
        run().with_context(|| format!("phase {name} failed"))?;
        println!(
            "::: phase {name} took {}s (total {}s)",
            t0.elapsed().as_secs(),
            started.elapsed().as_secs()
        );
        anyhow::Ok(())
    };
    phase("fmt", &mut || cargo(&["fmt", "--all", "--", "--check"]))?;
    phase("clippy", &mut || {
        cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ])
    })?;
    phase("lint", &mut || {
        crate::lint::run(&["--catalog".into(), path_arg(&catalog)?])
    })?;
    // The README's test command.
    phase("test", &mut || cargo(&["test", "--workspace", "--locked"]))?;
    phase("eval", &mut || {
        crate::eval::run(&[
            "--catalog".into(),
            path_arg(&catalog)?,
            "--cases".into(),
            path_arg(&cases)?,
            "--folds".into(),
            "5".into(),
            "--json".into(),
            "--min-turn-recall".into(),
            EVAL_GATE.to_string(),
        ])?;
        for (set, gate) in [("metatool", METATOOL_GATE), ("sealtools", SEALTOOLS_GATE)] {
            let dir = shared.join("eval/public").join(set);
            crate::eval::run(&[
                "--catalog".into(),
                path_arg(&dir.join("catalog"))?,
                "--cases".into(),
                path_arg(&dir.join("cases.jsonl"))?,
                "--history".into(),
                path_arg(&dir.join("history.jsonl"))?,
                "--embedder".into(),
                "none".into(),
                "--json".into(),
                "--min-turn-recall".into(),
                gate.to_string(),
            ])?;
        }
        Ok(())
    })?;
    println!("::: all phases passed in {}s", started.elapsed().as_secs());
    Ok(())
}

fn path_arg(path: &Path) -> anyhow::Result<String> {
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

/// Runs `cargo ARGS` in the workspace; fails on a non-zero exit.
fn cargo(args: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(args)
        .current_dir(crate::lint::workspace_root())
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_phase_or_argument_is_refused_before_anything_runs() {
        let err = run(&["--skip".into(), "fmt,typo".into()]).expect_err("typo");
        assert!(err.to_string().contains("unknown phase `typo`"), "{err}");
        let err = run(&["--fast".into()]).expect_err("unknown");
        assert!(
            err.to_string().contains("unknown argument `--fast`"),
            "{err}"
        );
        let err = run(&["--shared".into(), "/nonexistent-shared".into()]).expect_err("missing");
        assert!(err.to_string().contains("--skip lint,eval"), "{err}");
    }
}
