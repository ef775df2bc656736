//! `cargo xtask fit`: fits the router's scorer (`loadout_router::scorer`) on labeled
//! conversations with k folds by conversation, and writes the weights file.
//!
//! Each fold's feature rows are computed with the other folds as the learned memory,
//! so the learned and co-usage features are what a deployment would see on
//! conversations it never learned from. Each fold is then routed with weights fitted
//! on the other folds only; the selection rule (`SelectionRule`) is chosen on those
//! held-out routings, and the shipped weights are fitted on every fold's rows.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use loadout::Registry;
use loadout_router::replay::{
    Case, Report, all_but, cases_from_json_lines, folds, learned_turns, replay,
};
use loadout_router::scorer::{self, Model, Row, SelectionRule, Weights};
use loadout_router::{LearnedEntry, LearnedIndex, MessageVectors, RouteInput, Router};

const USAGE: &str = "usage: cargo xtask fit --catalog DIR --cases FILE [options]
  --folds K       folds by conversation (default 5)
  --out FILE      where to write the weights (default router/weights.json)
  --l2 X          L2 penalty on the weights (default 1)
  --lexical-only  fit the lexical model only; keep the shipped dense model";

/// A turn of recall is worth this many tools sent when the selection rule is chosen:
/// recall first, but a rule that sends 15 more tools for one turn in 300 loses.
const TOOLS_PER_TURN_OF_RECALL: f64 = 0.002;

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

#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    Lexical,
    Dense,
}

struct Fitted {
    model: Model,
    summary: serde_json::Value,
}

/// The feature rows and labels of one fold, and the learned memory it was routed with.
struct FoldData {
    rows: Vec<Row>,
    labels: Vec<bool>,
    learned: LearnedIndex,
}

fn fit_path(
    router: &mut Router,
    folds: &[Vec<Case>],
    options: &Options,
    path: Path,
) -> anyhow::Result<Fitted> {
    let started = Instant::now();
    let all: Vec<Case> = folds.iter().flatten().cloned().collect();
    let vectors = crate::eval::case_vectors(router, &all)?;
    let data = fold_data(router, folds, vectors.as_ref())?;
    let n_rows: usize = data.iter().map(|d| d.rows.len()).sum();
    let n_positive: usize = data
        .iter()
        .map(|d| d.labels.iter().filter(|&&l| l).count())
        .sum();
    println!(
        "{path:?}: {n_rows} rows ({n_positive} positive) from {} folds in {:.1} s",
        folds.len(),
        started.elapsed().as_secs_f64()
    );

    // Per fold, weights fitted on the other folds.
    let held_out: Vec<(f32, Row)> = (0..folds.len())
        .map(|f| {
            let (rows, labels) = pooled(&data, Some(f));
            scorer::fit(&rows, &labels, options.l2)
        })
        .collect();

    let mut best: Option<(f64, SelectionRule, Report, Vec<Report>)> = None;
    for rule in rule_grid() {
        let (total, per_fold) = route_folds(
            router,
            folds,
            &data,
            &held_out,
            rule,
            path,
            vectors.as_ref(),
        )?;
        let objective = total.turn_recall() - TOOLS_PER_TURN_OF_RECALL * total.mean_tools();
        if std::env::var_os("FIT_VERBOSE").is_some() {
            println!(
                "  {rule:?}: {:.3} @ {:.1}",
                total.turn_recall(),
                total.mean_tools()
            );
        }
        if best.as_ref().is_none_or(|(b, ..)| objective > *b) {
            best = Some((objective, rule, total, per_fold));
        }
    }
    let Some((_, rule, total, per_fold)) = best else {
        bail!("no selection rule to try");
    };
    println!("{path:?}: chosen rule {rule:?}");
    let mut fold_lines = Vec::new();
    for (f, report) in per_fold.iter().enumerate() {
        let line = format!("fold {f}: {}", report.summary_line());
        println!("  {line}");
        fold_lines.push(line);
    }
    println!("  all folds: {}", total.summary_line());

    let (rows, labels) = pooled(&data, None);
    let (bias, weights) = scorer::fit(&rows, &labels, options.l2);
    let model = Model::from_row(bias, &weights, rule);
    for (name, w) in &model.weights {
        println!("  {name:>22} {w:+.3}");
    }
    println!("  {:>22} {bias:+.3}", "bias");
    let summary = serde_json::json!({
        "rows": n_rows,
        "positive": n_positive,
        "turn_recall": (total.turn_recall() * 1000.0).round() / 1000.0,
        "mean_tools": (total.mean_tools() * 10.0).round() / 10.0,
        "folds": fold_lines,
    });
    Ok(Fitted { model, summary })
}

/// Each fold routed with the shipped weights, collecting its feature rows with the
/// other folds as its learned memory.
fn fold_data(
    router: &Router,
    folds: &[Vec<Case>],
    vectors: Option<&HashMap<String, MessageVectors>>,
) -> anyhow::Result<Vec<FoldData>> {
    let mut data = Vec::with_capacity(folds.len());
    for f in 0..folds.len() {
        let others = all_but(folds, f);
        let learned = learned_index(router, &learned_turns(&others), vectors);
        let mut rows = Vec::new();
        let mut labels = Vec::new();
        replay(router, &folds[f], None, Some(&learned), vectors, |routed| {
            let turn = &routed.case.turns[routed.turn_idx];
            let input = RouteInput {
                message: &turn.user,
                settings: routed.settings,
                session: routed.session,
                token_budget: None,
                learned: Some(&learned),
                vectors: vectors.and_then(|v| v.get(&turn.user)),
            };
            for (t, row) in router.feature_rows(&input) {
                let name = router.tool_name(t).unwrap_or("");
                labels.push(turn.needed.iter().any(|n| n == name));
                rows.push(row);
            }
        })
        .map_err(anyhow::Error::msg)?;
        data.push(FoldData {
            rows,
            labels,
            learned,
        });
    }
    Ok(data)
}

/// Every fold's rows and labels but `except`'s.
fn pooled(data: &[FoldData], except: Option<usize>) -> (Vec<Row>, Vec<bool>) {
    let mut rows = Vec::new();
    let mut labels = Vec::new();
    for (f, fold) in data.iter().enumerate() {
        if Some(f) != except {
            rows.extend_from_slice(&fold.rows);
            labels.extend_from_slice(&fold.labels);
        }
    }
    (rows, labels)
}

/// Each fold routed with its held-out weights and `rule`.
fn route_folds(
    router: &mut Router,
    folds: &[Vec<Case>],
    data: &[FoldData],
    held_out: &[(f32, Row)],
    rule: SelectionRule,
    path: Path,
    vectors: Option<&HashMap<String, MessageVectors>>,
) -> anyhow::Result<(Report, Vec<Report>)> {
    let mut total = Report::default();
    let mut per_fold = Vec::new();
    for (f, fold) in folds.iter().enumerate() {
        let (bias, row) = &held_out[f];
        let mut weights = router.weights().clone();
        let model = Model::from_row(*bias, row, rule);
        match path {
            Path::Lexical => weights.lexical = model,
            Path::Dense => weights.dense = model,
        }
        router.set_weights(weights);
        let report = replay(router, fold, None, Some(&data[f].learned), vectors, |_| {})
            .map_err(anyhow::Error::msg)?;
        per_fold.push(report.clone());
        total.absorb(report);
    }
    Ok((total, per_fold))
}

/// The selection rules tried.
fn rule_grid() -> Vec<SelectionRule> {
    let mut grid = Vec::new();
    for coverage in [0.9, 0.97] {
        for min_ratio in [0.01, 0.02, 0.05] {
            for min_probability in [0.001, 0.003, 0.01] {
                for (whole_domain_ratio, whole_domain_share) in
                    [(0.5, 0.25), (0.5, 0.5), (0.8, 0.25), (0.8, 0.5), (2.0, 0.0)]
                {
                    for fill_tokens in [0, 1500, 2500] {
                        grid.push(SelectionRule {
                            coverage,
                            min_ratio,
                            min_probability,
                            whole_domain_ratio,
                            whole_domain_share,
                            fill_tokens,
                        });
                    }
                }
            }
        }
    }
    grid
}

/// Past turns indexed for `router`, with the vectors its dense stage gave their
/// messages (the whole message's, the first piece).
fn learned_index(
    router: &Router,
    turns: &[(String, Vec<String>)],
    vectors: Option<&HashMap<String, MessageVectors>>,
) -> LearnedIndex {
    let model_id = router.dense().map(|dense| dense.model_id().to_owned());
    let entries: Vec<LearnedEntry> = turns
        .iter()
        .map(|(message, tools)| LearnedEntry {
            message: message.clone(),
            tools: tools.clone(),
            vector: vectors
                .and_then(|v| v.get(message))
                .and_then(|v| v.pieces().first().cloned()),
        })
        .collect();
    LearnedIndex::new(router, model_id.as_deref(), &entries)
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
