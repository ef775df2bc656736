//! `cargo xtask fit`: fits the router's scorer on labeled conversations with k folds
//! by conversation (`loadout_router::fit`), and writes the shipped weights file.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use loadout::Registry;
use loadout_router::Router;
use loadout_router::fit::{Fitted, Path};
use loadout_router::replay::{Case, cases_from_json_lines, folds};
use loadout_router::scorer::Weights;

const USAGE: &str = "usage: cargo xtask fit --catalog DIR --cases FILE [options]
  --folds K       folds by conversation (default 5)
  --out FILE      where to write the weights (default router/weights.json)
  --l2 X          L2 penalty on the weights (default 1)
  --lexical-only  fit the lexical model only; keep the shipped dense model";

struct Options {
    catalog: PathBuf,
    cases: PathBuf,
    folds: usize,
    out: PathBuf,
    l2: f64,
    lexical_only: bool,
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut catalog = None;
    let mut cases = None;
    let mut options = Options {
        catalog: PathBuf::new(),
        cases: PathBuf::new(),
        folds: 5,
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("router")
            .join("weights.json"),
        l2: 1.0,
        lexical_only: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .cloned()
                .with_context(|| format!("{arg} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--catalog" => catalog = Some(PathBuf::from(value()?)),
            "--cases" => cases = Some(PathBuf::from(value()?)),
            "--folds" => options.folds = value()?.parse().context("--folds")?,
            "--out" => options.out = PathBuf::from(value()?),
            "--l2" => options.l2 = value()?.parse().context("--l2")?,
            "--lexical-only" => options.lexical_only = true,
            "-h" | "--help" => bail!("{USAGE}"),
            other => bail!("unknown option {other}\n{USAGE}"),
        }
    }
    options.catalog = catalog.with_context(|| format!("--catalog is required\n{USAGE}"))?;
    options.cases = cases.with_context(|| format!("--cases is required\n{USAGE}"))?;
    if options.folds < 2 {
        bail!("--folds must be 2 or more");
    }
    Ok(options)
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = parse_args(args)?;
    let started = Instant::now();
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
    let mut lexical_router = Router::new(registry.clone(), crate::eval::eval_config());
    let lexical = fit_path(&mut lexical_router, &folds, &options, Path::Lexical)?;
    weights.lexical = lexical.model;
    let mut fitted = serde_json::json!({
        "cases": file_name(&options.cases),
        "catalog": file_name(&options.catalog),
        "folds": options.folds,
        "l2": options.l2,
        "date": chrono::Utc::now().format("%Y-%m-%d").to_string(),
        "lexical": lexical.summary,
    });
    if !options.lexical_only && loadout_embed::builtin_available() {
        let mut dense_router = Router::new(registry.clone(), crate::eval::eval_config());
        crate::eval::attach_embedder(
            &dense_router,
            &crate::eval::EmbedderChoice::Builtin,
            Some(&crate::eval::default_vector_cache()),
        )?;
        let dense = fit_path(&mut dense_router, &folds, &options, Path::Dense)?;
        weights.dense = dense.model;
        fitted["dense"] = dense.summary;
    } else if let Some(old) = Weights::shipped().fitted.get("dense") {
        fitted["dense"] = old.clone();
    }
    weights.fitted = fitted;
    let json = serde_json::to_string_pretty(&weights)? + "\n";
    std::fs::write(&options.out, json)
        .with_context(|| format!("writing {}", options.out.display()))?;
    println!(
        "wrote {} in {:.1} s",
        options.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One path fitted, its figures printed.
fn fit_path(
    router: &mut Router,
    folds: &[Vec<Case>],
    options: &Options,
    path: Path,
) -> anyhow::Result<Fitted> {
    let all: Vec<Case> = folds.iter().flatten().cloned().collect();
    let vectors = crate::eval::case_vectors(router, &all)?;
    let fitted = loadout_router::fit::fit_path(
        router,
        folds,
        options.l2,
        path,
        vectors.as_ref(),
        &mut |line| println!("{line}"),
    )
    .map_err(anyhow::Error::msg)?;
    for (name, w) in &fitted.model.weights {
        println!("  {name:>22} {w:+.3}");
    }
    println!("  {:>22} {:+.3}", "bias", fitted.model.bias);
    Ok(fitted)
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
