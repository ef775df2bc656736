//! `loadout fit`: fits the router's scorer on this deployment's own traffic, with
//! folds by conversation (`loadout_router::fit`, as `cargo xtask fit` fits the
//! shipped weights on the labeled set), and writes `weights.json` in the data dir.
//!
//! The training data is what the deployment learned from use: the stored sessions
//! (each turn needed the tools its model called, as `loadout replay` reads them) and
//! the learned entries no stored session holds (imports, examples, sessions since
//! purged), a session's entries as one conversation in the order it taught them and
//! an entry of no session as a one-turn conversation. The file is written only when the
//! fitted weights route the held-out folds at least as well as the weights in force,
//! by `fit::Options::objective` (turn recall less 0.002 a tool, and under
//! `--max-mean-tools` when given); `--dry-run` only prints,
//! `--reset` goes back to the shipped weights. Running servers take the file at their
//! next reload (SIGHUP). The fit is deterministic: replicas over one PostgreSQL store
//! that fit the same sessions write the same file.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use loadout_router::fit::{self, Path};
use loadout_router::replay::{Case, CaseTurn, Configured, folds};
use loadout_router::scorer::Weights;

use crate::app::App;
use crate::config::{WEIGHTS_FILE, fitted_on};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Fit on the most recently active this many sessions.
    #[arg(long, default_value_t = 20_000)]
    sessions: usize,
    /// Only sessions active in the last this many days.
    #[arg(long, default_value_t = 90)]
    since_days: u32,
    /// Fit on the labeled conversations of this JSON-lines file (the eval set's
    /// format, or what `loadout replay --export` wrote) instead of the stored ones.
    #[arg(long, value_name = "FILE")]
    cases: Option<PathBuf>,
    /// Folds by conversation.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(2..=50))]
    folds: u16,
    /// L2 penalty on the weights.
    #[arg(long, default_value_t = 1.0)]
    l2: f64,
    /// The most tools a turn may be sent on average: the selection rule is chosen
    /// among those that stay under it (a client's cap, or a price on tokens).
    #[arg(long, value_name = "N", value_parser = mean_tools_arg)]
    max_mean_tools: Option<f64>,
    /// Fit the lexical model only (the dense model stays as it is).
    #[arg(long)]
    lexical: bool,
    /// Also load the toolkit files of this directory.
    #[arg(long)]
    catalog: Option<PathBuf>,
    /// Leave out the upstream MCP servers of `loadout.toml`.
    #[arg(long)]
    no_upstream: bool,
    /// Print the figures; write nothing.
    #[arg(long, conflicts_with = "force")]
    dry_run: bool,
    /// Write the weights even when they route the held-out folds worse than the
    /// weights in force.
    #[arg(long)]
    force: bool,
    /// Remove `weights.json`: route with the shipped weights again.
    #[arg(long, conflicts_with_all = ["cases", "dry_run", "force", "lexical"])]
    pub reset: bool,
}

/// A mean number of tools a turn, as `--max-mean-tools` takes it: a number, 0 or more
/// (a NaN would cap nothing and say nothing).
pub fn mean_tools_arg(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 => Ok(n),
        _ => Err("expected a mean number of tools, 0 or more".to_owned()),
    }
}

/// Fewer labeled turns than this fit noise: the command refuses.
const MIN_TURNS: usize = 30;

pub async fn run(app: &App, args: Args) -> anyhow::Result<ExitCode> {
    if args.reset {
        return reset(app.store().data_dir());
    }
    let path = app.store().data_dir().join(WEIGHTS_FILE);
    let (app, upstreams) = super::as_served(app, args.catalog.as_deref(), args.no_upstream).await?;
    let done = fit_and_write(&app, &args, &path).await;
    upstreams.shutdown().await;
    done
}

/// `--reset`: removes the data dir's weights file.
pub fn reset(data_dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let path = data_dir.join(WEIGHTS_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => outln!(
            "removed {}: routers built from now on (a running server's at its next reload, SIGHUP) use the shipped weights",
            path.display()
        )?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            outln!("no {}: the shipped weights are in force", path.display())?
        }
        Err(e) => anyhow::bail!("cannot remove {}: {e}", path.display()),
    }
    Ok(ExitCode::SUCCESS)
}

async fn fit_and_write(app: &App, args: &Args, path: &std::path::Path) -> anyhow::Result<ExitCode> {
    let (cases, source) = training_cases(app, args).await?;
    let labeled = cases
        .iter()
        .flat_map(|case| &case.turns)
        .filter(|turn| !turn.needed.is_empty())
        .count();
    if labeled < MIN_TURNS || cases.len() < usize::from(args.folds) {
        anyhow::bail!(
            "too little to fit: {labeled} turns that called a tool in {} conversations ({source}); a fit needs {MIN_TURNS} turns or more, in at least as many conversations as folds ({})",
            cases.len(),
            args.folds
        );
    }
    outln!(
        "fitting on {source}: {} conversations, {labeled} turns that called a tool; weights in force: {}",
        cases.len(),
        app.config()
            .weights
            .as_ref()
            .map(|w| format!("{WEIGHTS_FILE} ({})", fitted_on(w)))
            .unwrap_or_else(|| "shipped".to_owned())
    )?;
    let (weights, better) = fit_weights(app, args, &cases).await?;
    if args.dry_run {
        outln!("--dry-run: nothing written")?;
        return Ok(ExitCode::SUCCESS);
    }
    if !better && !args.force {
        outln!(
            "not written: the fitted weights route the held-out folds worse than the weights in force (turn recall less 0.002 a tool); --force writes them anyway"
        )?;
        return Ok(ExitCode::FAILURE);
    }
    let json = serde_json::to_string_pretty(&weights)? + "\n";
    write_atomically(path, &json)?;
    outln!(
        "wrote {}: routers built from now on use it (a running server at its next reload, SIGHUP)",
        path.display()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `--cases`, or the stored sessions and the learned entries no stored session holds;
/// with a phrase naming them.
async fn training_cases(app: &App, args: &Args) -> anyhow::Result<(Vec<Case>, String)> {
    if let Some(file) = &args.cases {
        return Ok((super::replay::read_cases(file)?, file.display().to_string()));
    }
    let mut cases = super::replay::stored_cases(app, None, args.sessions, args.since_days).await?;
    let sessions = cases.len();
    let learned = learned_cases(app, &cases).await?;
    let n_entries: usize = learned.iter().map(|case| case.turns.len()).sum();
    let n_conversations = learned.len();
    cases.extend(learned);
    let source = format!(
        "{sessions} sessions of the last {} days and {n_entries} learned entries \
         ({n_conversations} conversations) of no stored session",
        args.since_days
    );
    Ok((cases, source))
}

/// The weights in force with each path's model refitted (the dense one when the dense
/// stage runs and `--lexical` is not given), and whether every refitted model routes
/// the held-out folds at least as well as the one it replaces.
async fn fit_weights(app: &App, args: &Args, cases: &[Case]) -> anyhow::Result<(Weights, bool)> {
    let folds = folds(cases, usize::from(args.folds));
    let mut weights = app.config().router_weights();
    let before = weights.fitted.clone();
    let mut summaries = serde_json::Map::new();
    let mut better = true;
    let mut paths = vec![Path::Lexical];
    let (dense_router, dense) =
        super::replay::router_for(app, app.new_router(app.registry.clone()), args.lexical).await;
    // A joined stage fits its own model; the dense one stays for messages its
    // first encoder alone embeds (the fallback when the joined encoder is busy).
    if let Some(index) = dense_router.dense() {
        paths.push(if index.is_joined() {
            Path::Joined
        } else {
            Path::Dense
        });
    } else {
        outln!("dense model not fitted: {dense}")?;
    }
    // The vectors the learned memory keeps spare embedding those messages again.
    let known =
        super::replay::learned_vectors(app, dense_router.dense().map(|d| d.model_id())).await;
    let mut jobs = Vec::new();
    for path in paths {
        let mut router = app.new_router(app.registry.clone());
        let vectors = match path {
            Path::Lexical => None,
            Path::Dense | Path::Joined => {
                // The dense stage's index, built once above, serves this router too.
                router.set_dense(dense_router.dense().cloned());
                super::replay::case_vectors(&router, cases, &known)
            }
        };
        jobs.push((path, router, vectors));
    }
    // The paths' fits side by side, each spreading its own jobs (`side_by_side`) and
    // printing its lines as one block.
    let options = fit::Options {
        l2: args.l2,
        max_mean_tools: args.max_mean_tools,
    };
    let results = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let running: Vec<_> = jobs
                .into_iter()
                .map(|(path, router, vectors)| {
                    let folds = &folds;
                    scope.spawn(move || {
                        let mut lines = Vec::new();
                        let fitted = fit::fit_path(
                            &router,
                            folds,
                            &options,
                            path,
                            vectors.as_ref(),
                            &mut |line| lines.push(line),
                            &side_by_side,
                        );
                        let _ = outln!("{}", lines.join("\n"));
                        (path, fitted)
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|fit| fit.join().map_err(|_| "a fit panicked".to_owned()))
                .collect::<Vec<_>>()
        })
    });
    for result in results {
        let (path, fitted) = result.map_err(anyhow::Error::msg)?;
        let fitted = fitted.map_err(anyhow::Error::msg)?;
        better &= options.objective(&fitted.held_out) >= options.objective(&fitted.before);
        summaries.insert(format!("{path:?}").to_lowercase(), fitted.summary);
        weights = fit::with_model(&weights, path, fitted.model);
    }
    let mut fitted = serde_json::json!({
        "cases": "stored sessions",
        "folds": args.folds,
        "l2": args.l2,
        "max_mean_tools": args.max_mean_tools,
        "date": chrono::Utc::now().format("%Y-%m-%d").to_string(),
    });
    if let Some(file) = &args.cases {
        fitted["cases"] = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .into();
    }
    for (path, summary) in summaries {
        fitted[path] = summary;
    }
    // A model kept as it was keeps the note of its fit (the encoder it holds for).
    for path in ["dense", "joined"] {
        if fitted.get(path).is_none()
            && let Some(old) = before.get(path)
        {
            fitted[path] = old.clone();
        }
    }
    weights.fitted = fitted;
    Ok((weights, better))
}

/// Runs a fit's independent jobs (each fold's rows, the held-out fits) a thread each.
pub fn side_by_side(jobs: Vec<fit::Job<'_>>) {
    std::thread::scope(|scope| {
        for job in jobs {
            scope.spawn(job);
        }
    });
}

/// The learned entries of sessions `cases` does not hold, with today's settings:
/// a session's entries one conversation, in the order it taught them (what the
/// `next_step` feature learns from); an entry of no session a conversation of its own.
async fn learned_cases(app: &App, cases: &[Case]) -> anyhow::Result<Vec<Case>> {
    let stored: BTreeSet<&str> = cases.iter().map(|case| case.id.as_str()).collect();
    let settings = app.settings.snapshot().await?;
    let configured: Vec<String> = app
        .registry
        .domains()
        .iter()
        .filter(|d| app.registry.missing_settings(&d.name, &settings).is_empty())
        .flat_map(|d| d.settings_keys.iter().cloned())
        .collect();
    let rows = app.store().learned_rows(None, None).await?;
    let mut learned: Vec<Case> = Vec::new();
    let mut case_of_session: std::collections::HashMap<String, usize> =
        std::collections::HashMap::new();
    for row in rows {
        if row.session.as_deref().is_some_and(|s| stored.contains(s)) {
            continue;
        }
        let called: Vec<String> = row
            .tools
            .into_iter()
            .filter(|t| app.registry.tool(t).is_some())
            .collect();
        if called.is_empty() {
            continue;
        }
        // Core tools are always sent: only optional ones are needed, as in
        // `loadout replay`.
        let needed: Vec<String> = called
            .iter()
            .filter(|name| {
                app.registry
                    .tool(name)
                    .and_then(|tool| app.registry.domain(&tool.domain))
                    .is_some_and(|d| !d.always_on)
            })
            .cloned()
            .collect();
        let turn = CaseTurn {
            user: row.message,
            needed,
            called: Some(called),
        };
        let existing = row
            .session
            .as_ref()
            .and_then(|session| case_of_session.get(session).copied());
        if let Some(i) = existing {
            learned[i].turns.push(turn);
            continue;
        }
        if let Some(session) = row.session {
            case_of_session.insert(session, learned.len());
        }
        learned.push(Case {
            id: format!("learned-{}", row.id),
            configured: Configured::Keys(configured.clone()),
            turns: vec![turn],
            why: None,
        });
    }
    Ok(learned)
}

/// Writes `text` to a file beside `path`, then renames it over `path`: a reader
/// sees the old weights or the new, never half a file.
fn write_atomically(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}
