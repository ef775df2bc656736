//! `cargo xtask fit`: fits the router's scorer on labeled conversations with k folds
//! by conversation (`loadout_router::fit`), and writes the shipped weights file.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use loadout::Registry;
use loadout_router::fit::{Fitted, Path};
use loadout_router::replay::{Case, cases_from_json_lines, folds};
use loadout_router::scorer::Weights;
use loadout_router::{MessageVectors, Router};

/// `cargo xtask fit`'s options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The toolkit directory the router routes over.
    #[arg(long, value_name = "DIR")]
    catalog: PathBuf,
    /// The labeled conversations, one JSON object a line.
    #[arg(long, value_name = "FILE")]
    cases: PathBuf,
    /// Folds by conversation, 2 or more.
    #[arg(long, value_name = "K", default_value_t = 5, value_parser = crate::eval::folds_arg)]
    folds: usize,
    /// Where to write the weights (default router/weights.json of this workspace).
    #[arg(long, value_name = "FILE", default_value_os_t = shipped_weights(),
          hide_default_value = true)]
    out: PathBuf,
    /// L2 penalty on the weights.
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    l2: f64,
    /// The most tools the selection rule may send a turn on average (a client's cap,
    /// or a price on tokens); without it a tool is worth 0.002 of turn recall.
    #[arg(long, value_name = "N", value_parser = loadout_server::cli::fit::mean_tools_arg)]
    max_mean_tools: Option<f64>,
    /// Fit the lexical model only; keep the shipped dense model.
    #[arg(long)]
    lexical_only: bool,
    /// The dense path's encoder: `builtin`, `static` for the table distilled from it
    /// (its own model; see `router_dense = static`), or an OpenAI-compatible endpoint
    /// and model as `eval --embedder` names it: the dense weights belong to the
    /// encoder they were fitted with.
    #[arg(long, value_name = "builtin|static|e5:FILE|URL#MODEL", default_value = "builtin",
          value_parser = dense_embedder)]
    embedder: crate::eval::EmbedderChoice,
    /// Fit nothing: write every turn's feature rows, each fold with the other folds
    /// as learned memory, to FILE as JSON lines (the dense path's, or the lexical
    /// path's with `--lexical-only`), for a study of a feature outside the fit
    /// (`scripts/second_encoder.py`). A tool's row is kept when the turn needed it or
    /// it has a rank by BM25 or by cosine (among the first 50 of a piece: the ranks
    /// the router keeps).
    #[arg(long, value_name = "FILE")]
    rows: Option<PathBuf>,
    /// Print nothing (`cargo xtask bench` times the fit).
    #[arg(skip)]
    quiet: bool,
}

impl Args {
    /// The fit `cargo xtask bench` times: 5 folds, both paths unless `lexical_only`,
    /// written to `out`, printing nothing.
    pub fn for_bench(catalog: PathBuf, cases: PathBuf, out: PathBuf, lexical_only: bool) -> Args {
        Args {
            catalog,
            cases,
            folds: 5,
            out,
            l2: 1.0,
            max_mean_tools: None,
            lexical_only,
            embedder: crate::eval::EmbedderChoice::Builtin,
            rows: None,
            quiet: true,
        }
    }
}

fn dense_embedder(text: &str) -> anyhow::Result<crate::eval::EmbedderChoice> {
    use crate::eval::EmbedderChoice;
    match EmbedderChoice::parse(text)? {
        EmbedderChoice::None => anyhow::bail!(
            "--embedder {text}: the dense path needs an encoder; --lexical-only fits without one"
        ),
        choice => Ok(choice),
    }
}

/// The weights file the router ships with.
fn shipped_weights() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("router")
        .join("weights.json")
}

pub fn run(options: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    if options.out == shipped_weights() && options.embedder.is_external() {
        anyhow::bail!(
            "--embedder {}: the shipped weights are the built-in encoder's; write these with --out FILE",
            options.embedder
        );
    }
    let registry = Arc::new(
        Registry::builder()
            .toolkit_dir(&options.catalog)
            .with_context(|| format!("loading catalog {}", options.catalog.display()))?
            .build()
            .context("building the registry")?,
    );
    let text = std::fs::read_to_string(&options.cases)
        .with_context(|| format!("reading {}", options.cases.display()))?;
    let cases = cases_from_json_lines(&text).map_err(anyhow::Error::msg)?;
    let folds = folds(&cases, options.folds);

    let mut weights = Weights::shipped();
    let joined = matches!(options.embedder, crate::eval::EmbedderChoice::Joined(..));
    let encoder_here = options.embedder.is_external() || loadout_embed::builtin_available();
    let dense_router = if !options.lexical_only && encoder_here {
        let router = Router::new(registry.clone(), crate::eval::eval_config());
        crate::eval::attach_embedder(
            &router,
            &options.embedder,
            Some(&crate::eval::default_vector_cache()),
        )?;
        Some(router)
    } else {
        None
    };
    let dense_path = if joined { Path::Joined } else { Path::Dense };
    if let Some(out) = &options.rows {
        let (router, path) = match dense_router {
            Some(router) => (router, dense_path),
            None => (
                Router::new(registry.clone(), crate::eval::eval_config()),
                Path::Lexical,
            ),
        };
        return write_rows(&router, &folds, path, out);
    }
    if joined {
        // The joined model is a third: the lexical and dense ones stay as shipped.
        let Some(router) = dense_router else {
            anyhow::bail!("--embedder {}: no encoder here", options.embedder);
        };
        let fitted = fit_path(&router, &folds, options, Path::Joined)?;
        weights.joined = Some(fitted.model);
        weights.fitted["joined"] = fitted.summary;
        weights.fitted["joined"]["cases"] = file_name(&options.cases).into();
        weights.fitted["joined"]["date"] = chrono::Utc::now().format("%Y-%m-%d").to_string().into();
        return write_weights(&weights, options, started);
    }
    // The two paths' fits side by side (each spreading its own jobs over threads too):
    // neither reads the other's router.
    let (lexical, dense) = std::thread::scope(|scope| {
        let lexical = scope.spawn(|| {
            let router = Router::new(registry.clone(), crate::eval::eval_config());
            fit_path(&router, &folds, options, Path::Lexical)
        });
        let dense = dense_router.map(|router| fit_path(&router, &folds, options, Path::Dense));
        let lexical = lexical
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the lexical fit panicked")));
        (lexical, dense)
    });
    let lexical = lexical?;
    weights.lexical = lexical.model;
    let mut fitted = serde_json::json!({
        "cases": file_name(&options.cases),
        "catalog": file_name(&options.catalog),
        "folds": options.folds,
        "l2": options.l2,
        "max_mean_tools": options.max_mean_tools,
        "date": chrono::Utc::now().format("%Y-%m-%d").to_string(),
        "lexical": lexical.summary,
    });
    if let Some(dense) = dense {
        let dense = dense?;
        weights.dense = dense.model;
        fitted["dense"] = dense.summary;
    } else if let Some(old) = Weights::shipped().fitted.get("dense") {
        fitted["dense"] = old.clone();
    }
    if let Some(old) = Weights::shipped().fitted.get("joined") {
        fitted["joined"] = old.clone();
    }
    weights.fitted = fitted;
    write_weights(&weights, options, started)
}

fn write_weights(weights: &Weights, options: &Args, started: Instant) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(weights)? + "\n";
    std::fs::write(&options.out, json)
        .with_context(|| format!("writing {}", options.out.display()))?;
    if options.quiet {
        return Ok(());
    }
    println!(
        "wrote {} in {:.1} s",
        options.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One path fitted, its figures printed as one block when it ends (the other path's
/// fit runs beside it).
fn fit_path(
    router: &Router,
    folds: &[Vec<Case>],
    options: &Args,
    path: Path,
) -> anyhow::Result<Fitted> {
    let vectors = fold_vectors(router, folds)?;
    let started = Instant::now();
    let mut lines = Vec::new();
    let fitted = loadout_router::fit::fit_path(
        router,
        folds,
        &loadout_router::fit::Options {
            l2: options.l2,
            max_mean_tools: options.max_mean_tools,
        },
        path,
        vectors.as_ref(),
        &mut |line| lines.push(format!("{line} ({:.0} s)", started.elapsed().as_secs_f64())),
        &loadout_server::cli::fit::side_by_side,
    );
    let mut block = lines.join("\n");
    if let Ok(fitted) = &fitted {
        for (name, w) in &fitted.model.weights {
            block.push_str(&format!("\n  {name:>22} {w:+.3}"));
        }
        block.push_str(&format!("\n  {:>22} {:+.3}", "bias", fitted.model.bias));
    }
    if !options.quiet {
        println!("{block}");
    }
    fitted.map_err(anyhow::Error::msg)
}

/// Every message's vectors for `router`'s dense stage, through the workspace's
/// vector cache; `None` for a router without one (the lexical path).
fn fold_vectors(
    router: &Router,
    folds: &[Vec<Case>],
) -> anyhow::Result<Option<HashMap<String, MessageVectors>>> {
    let all: Vec<Case> = folds.iter().flatten().cloned().collect();
    crate::eval::case_vectors(router, &all, Some(&crate::eval::default_vector_cache()))
}

/// `cargo xtask fit --rows`: every turn's rows on `path`, the likely and the needed
/// tools' (see the option).
fn write_rows(
    router: &Router,
    folds: &[Vec<Case>],
    path: Path,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    use loadout_router::scorer::f;
    let vectors = fold_vectors(router, folds)?;
    let turns = loadout_router::fit::turn_rows(
        router,
        folds,
        vectors.as_ref(),
        &loadout_server::cli::fit::side_by_side,
    )
    .map_err(anyhow::Error::msg)?;
    let mut text = String::new();
    for mut turn in turns {
        let candidates = std::mem::take(&mut turn.tools).into_iter().zip(&turn.rows);
        let (tools, rows) = candidates
            .filter(|(tool, row)| {
                turn.needed.contains(tool)
                    || row[f::TOOL_BM25_RANK] > 0.0
                    || row[f::TOOL_DENSE_RANK] > 0.0
            })
            .unzip();
        let turn = loadout_router::fit::TurnRows {
            tools,
            rows,
            ..turn
        };
        text.push_str(&serde_json::to_string(&turn)?);
        text.push('\n');
    }
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {} ({path:?} rows)", out.display());
    Ok(())
}

/// The last component of a path: the weights file names its data, not a machine's
/// folders.
fn file_name(path: &std::path::Path) -> String {
    let parent = path
        .parent()
        .and_then(|p| p.file_name())
        .map(|p| p.to_string_lossy().into_owned());
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match parent {
        Some(parent) => format!("{parent}/{name}"),
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fit `cargo xtask bench` times is the command's, with its defaults.
    #[test]
    fn the_bench_fit_has_the_command_line_defaults() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let argv = ["fit", "--catalog", "c", "--cases", "d", "--out", "o"];
        let parsed = <Cli as clap::Parser>::parse_from(argv).args;
        let bench = Args::for_bench("c".into(), "d".into(), "o".into(), false);
        assert_eq!(
            (
                parsed.folds,
                parsed.l2,
                &parsed.embedder,
                parsed.lexical_only
            ),
            (bench.folds, bench.l2, &bench.embedder, bench.lexical_only)
        );
        assert!(bench.quiet && !parsed.quiet);
    }

    #[test]
    fn the_dense_path_takes_any_encoder_but_none() {
        assert!(dense_embedder("none").is_err());
        assert!(dense_embedder("builtin").is_ok());
        assert!(matches!(
            dense_embedder("http://127.0.0.1:8000/v1#e5-query"),
            Ok(crate::eval::EmbedderChoice::Endpoint { .. })
        ));
    }
}
