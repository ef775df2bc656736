//! `cargo xtask ci`: the checks every change must pass, in the order `.ci/run` runs
//! them, each phase timed: formatting, clippy, the domain lint, the test suite and
//! the routing eval gate. What the suites need from the machine (PostgreSQL, Python
//! clients, npm servers, a browser) is `.ci/run`'s job; here a suite whose server is
//! missing skips itself, unless `CI=true` (as `.ci/run` sets it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use crate::{eval, lint};

/// The eval gates: turn recall below these, or more tools sent on average than
/// these, fails CI, a margin from what each set reaches (docs/performance.md). Dev is
/// routed as served (the built-in encoder), each of 5 folds with what the other folds
/// teach; the public sets lexical-only with their history, since encoding 20,000 past
/// messages in CI's debug build takes about a quarter of an hour.
pub const EVAL_GATE: Gate = Gate {
    turn_recall: 0.92,
    mean_tools: 31.0,
};
const METATOOL_GATE: Gate = Gate {
    turn_recall: 0.93,
    mean_tools: 35.0,
};
const SEALTOOLS_GATE: Gate = Gate {
    turn_recall: 0.90,
    mean_tools: 44.0,
};
/// API-Bank is multi-turn: it holds the answers to the model's questions (`pending`).
const APIBANK_GATE: Gate = Gate {
    turn_recall: 0.93,
    mean_tools: 17.5,
};

/// Dev with e5 joined to the built-in encoder (the joined model), and its Hangul
/// turns' least recall: the built-in encoder alone cannot read them.
const JOINED_GATE: Gate = Gate {
    turn_recall: 0.93,
    mean_tools: 29.0,
};
const JOINED_KOREAN_RECALL: f64 = 0.88;

/// Least turn recall and most mean tools a set may route at.
#[derive(Debug, Clone, Copy)]
pub struct Gate {
    pub turn_recall: f64,
    pub mean_tools: f64,
}

const PHASES: [&str; 5] = ["fmt", "clippy", "lint", "test", "eval"];

/// `cargo xtask ci`'s options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The shared material: eval/catalog, eval/dev.jsonl and eval/public.
    #[arg(long, value_name = "DIR", default_value = "../shared")]
    pub shared: PathBuf,
    /// Phases to leave out, comma-separated, of: fmt, clippy, lint, test, eval
    /// (repeatable).
    #[arg(long, value_name = "PHASE,...", value_parser = phases)]
    pub skip: Vec<Phases>,
}

/// One `--skip` list, checked against [`PHASES`].
#[derive(Debug, Clone)]
pub struct Phases(Vec<&'static str>);

/// Parses `--skip`'s list: names trimmed, empty ones ignored, an unknown one refused
/// before any phase runs.
fn phases(list: &str) -> Result<Phases, String> {
    let mut phases = Vec::new();
    for phase in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match PHASES.iter().find(|&&known| known == phase) {
            Some(known) => phases.push(*known),
            None => return Err(format!("unknown phase `{phase}`")),
        }
    }
    Ok(Phases(phases))
}

impl Args {
    fn wanted(&self, phase: &str) -> bool {
        !self.skip.iter().any(|list| list.0.contains(&phase))
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let catalog = args.shared.join("eval/catalog");
    if (args.wanted("lint") || args.wanted("eval")) && !catalog.is_dir() {
        bail!(
            "{} is missing: pass --shared DIR, or --skip lint,eval",
            catalog.display()
        );
    }

    let started = Instant::now();
    let phase = |name: &str, run: &mut dyn FnMut() -> anyhow::Result<()>| {
        if !args.wanted(name) {
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
        lint::run(&lint::Args {
            catalogs: vec![catalog.clone()],
        })
    })?;
    // The README's test command.
    phase("test", &mut || cargo(&["test", "--workspace", "--locked"]))?;
    phase("eval", &mut || eval_gates(&args.shared))?;
    println!("::: all phases passed in {}s", started.elapsed().as_secs());
    Ok(())
}

/// The eval gate's runs: dev in 5 folds as served, then with e5 joined, then each
/// public set lexical-only with its history.
fn eval_gates(shared: &Path) -> anyhow::Result<()> {
    let eval_dir = shared.join("eval");
    eval::run(&eval::Args {
        folds: Some(5),
        embedder: eval::EmbedderChoice::default_for_build(),
        json: true,
        min_turn_recall: Some(EVAL_GATE.turn_recall),
        max_mean_tools: Some(EVAL_GATE.mean_tools),
        gate_learning: true,
        ..eval::Args::new(eval_dir.join("catalog"), eval_dir.join("dev.jsonl"))
    })?;
    // The joined stage needs e5's model file, which `.ci/run` downloads.
    match std::env::var_os("LOADOUT_E5_MODEL") {
        Some(model) => eval::run(&eval::Args {
            folds: Some(5),
            embedder: eval::EmbedderChoice::builtin_and_e5(model.into()),
            json: true,
            min_turn_recall: Some(JOINED_GATE.turn_recall),
            max_mean_tools: Some(JOINED_GATE.mean_tools),
            min_korean_recall: Some(JOINED_KOREAN_RECALL),
            gate_learning: true,
            ..eval::Args::new(eval_dir.join("catalog"), eval_dir.join("dev.jsonl"))
        })?,
        None if std::env::var_os("CI").is_some() => {
            bail!("LOADOUT_E5_MODEL is unset: the joined gate needs e5's model file")
        }
        None => println!("joined gate skipped: LOADOUT_E5_MODEL is unset"),
    }
    for (set, gate) in [
        ("metatool", METATOOL_GATE),
        ("sealtools", SEALTOOLS_GATE),
        ("apibank", APIBANK_GATE),
    ] {
        let dir = eval_dir.join("public").join(set);
        eval::run(&eval::Args {
            history: Some(dir.join("history.jsonl")),
            embedder: eval::EmbedderChoice::None,
            json: true,
            min_turn_recall: Some(gate.turn_recall),
            max_mean_tools: Some(gate.mean_tools),
            gate_learning: true,
            ..eval::Args::new(dir.join("catalog"), dir.join("cases.jsonl"))
        })?;
    }
    Ok(())
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
    use clap::Parser;

    use super::*;

    /// `ci`'s options alone, as `cargo xtask ci` parses them.
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn an_unknown_phase_or_argument_is_refused_before_anything_runs() {
        let err = Cli::try_parse_from(["ci", "--skip", "fmt,typo"])
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("unknown phase `typo`")),
            "{err:?}"
        );
        let err = Cli::try_parse_from(["ci", "--fast"])
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("'--fast'")),
            "{err:?}"
        );
        let args = Cli::parse_from(["ci", "--shared", "/nonexistent-shared"]).args;
        let err = run(&args).expect_err("missing");
        assert!(err.to_string().contains("--skip lint,eval"), "{err}");
    }

    #[test]
    fn skipped_phases_add_up_over_lists_and_blanks() {
        // As `.ci/run` passes them, and with the spaces and repeats a person types.
        let args = Cli::parse_from(["ci", "--shared", "s", "--skip", "test"]).args;
        assert!(!args.wanted("test") && args.wanted("eval"));
        assert_eq!(args.shared, Path::new("s"));
        let args = Cli::parse_from(["ci", "--skip", "fmt, clippy,", "--skip", "eval"]).args;
        let wanted: Vec<&str> = PHASES.into_iter().filter(|p| args.wanted(p)).collect();
        assert_eq!(wanted, ["lint", "test"]);
        assert_eq!(Cli::parse_from(["ci"]).args.shared, Path::new("../shared"));
    }
}
