//! `loadout replay`: the stored sessions (or a cases file) routed again with the
//! current tools and config, measured as `cargo xtask eval` measures the labeled set:
//! did each turn get the tools its model went on to call?
//!
//! A stored turn "needed" the tools of optional domains its model called with
//! success: in a chat turn (`/api/chat`) or, for clients running their own model, as
//! reported in the next `/api/route` request's `called`. A tool the model had to load
//! by name (`load_tools`) counts too: the router missed it, and the model paid a step
//! to recover. Replaying with another `--config` shows what a change would do to
//! this deployment's own traffic before it is deployed. Nothing is written.

use std::collections::{BTreeSet, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use loadout::Registry;
use loadout_router::Router;
use loadout_router::replay::{
    Case, CaseTurn, Comparison, Configured, cases_from_json_lines, replay,
};
use loadout_store::{MessageRow, Reasons, called_tool};

use crate::app::App;
use crate::config::ConfigFile;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Replay the most recently active this many sessions.
    #[arg(long, default_value_t = 200)]
    sessions: usize,
    /// Only sessions active in the last this many days.
    #[arg(long, default_value_t = 30)]
    since_days: u32,
    /// Replay only this session.
    #[arg(long, conflicts_with = "cases")]
    session: Option<String>,
    /// Replay the conversations of this JSON-lines file (the eval set's format, or
    /// what `--export` wrote) instead of the stored sessions.
    #[arg(long)]
    cases: Option<PathBuf>,
    /// Write the stored sessions as cases (JSON lines; `-` for stdout) instead of
    /// replaying them: label or edit them, then `--cases`.
    #[arg(long, conflicts_with = "cases")]
    export: Option<PathBuf>,
    /// Also load the toolkit files of this directory.
    #[arg(long)]
    catalog: Option<PathBuf>,
    /// Route lexical-only, without the dense stage.
    #[arg(long)]
    lexical: bool,
    /// Token budget instead of the config's.
    #[arg(long)]
    budget: Option<usize>,
    /// Print every turn's summary line.
    #[arg(long, short)]
    verbose: bool,
    /// End with the figures as one JSON object.
    #[arg(long)]
    json: bool,
    /// Also replay with the `[router]` of this config file, and list the turns it
    /// would break (now missed) and fix (now hit) against the config in force.
    #[arg(long, value_name = "CANDIDATE.toml", conflicts_with = "export")]
    compare: Option<PathBuf>,
    /// Leave out the upstream MCP servers of `loadout.toml`; their tools' calls
    /// then count as unknown. By default they are started (or connected) as
    /// `loadout serve` does.
    #[arg(long)]
    no_upstream: bool,
}

pub async fn run(app: &App, args: Args) -> anyhow::Result<ExitCode> {
    let (app, upstreams) = super::as_served(app, args.catalog.as_deref(), args.no_upstream).await?;
    let done = replay_or_export(&app, &args).await;
    upstreams.shutdown().await;
    done
}

async fn replay_or_export(app: &App, args: &Args) -> anyhow::Result<ExitCode> {
    let (cases, source) = load_cases(app, args).await?;
    if let Some(path) = &args.export {
        export_cases(path, &cases)?;
        return Ok(ExitCode::SUCCESS);
    }

    // The candidate first: a bad file should stop the command before any routing.
    let candidate = match &args.compare {
        // The candidate's `[router]` with the weights in force.
        Some(path) => {
            Some(ConfigFile::load(path, true)?.with_weights_from(app.store().data_dir())?)
        }
        None => None,
    };
    let (router, dense) = router_for(app, app.new_router(app.registry.clone()), args.lexical).await;
    let file = app.config();
    let config = config_phrase(&file);
    outln!(
        "replay of {source}: {} tools, {dense}, budget {}; config {config}",
        router.registry().all_tools().len(),
        args.budget.unwrap_or(router.config().token_budget),
    )?;
    let verbose = args.verbose;
    let on_turn = |routed: &loadout_router::replay::Routed<'_>| {
        if verbose {
            // A closed reader fails the next line printed after the replay too.
            let _ = outln!(
                "{} #{} {:?}\n    {}",
                routed.case.id,
                routed.turn_idx + 1,
                routed.case.turns[routed.turn_idx].user,
                routed.selection.summary_line()
            );
        }
    };
    // Each message embedded by the router's own encoder, then the cases routed.
    let replay_with = |router: &Router| {
        let vectors = case_vectors(router, &cases, &HashMap::new());
        replay(router, &cases, args.budget, None, vectors.as_ref(), on_turn)
            .map_err(anyhow::Error::msg)
    };
    let report = replay_with(&router)?;
    let Some(candidate) = candidate else {
        for line in report.miss_lines() {
            outln!("{line}")?;
        }
        outln!("{}", report.summary_line())?;
        if args.json {
            let mut summary = report.to_json();
            summary["source"] = source.into();
            outln!("{summary}")?;
        }
        return Ok(ExitCode::SUCCESS);
    };

    let changes = file.router_changes(&candidate);
    outln!(
        "candidate {}: {}",
        candidate.path.display(),
        if changes.is_empty() {
            "[router] as in force".to_owned()
        } else {
            changes.join(", ")
        }
    )?;
    let built = candidate.router(app.registry.clone());
    let (router, _) = router_for(app, built, args.lexical).await;
    let tried = replay_with(&router)?;
    let comparison = Comparison::new(&report, &tried);
    for line in comparison.lines() {
        outln!("{line}")?;
    }
    outln!("baseline   {}", report.summary_line())?;
    outln!("candidate  {}", tried.summary_line())?;
    outln!(
        "{} turns now missed, {} now hit",
        comparison.now_missed.len(),
        comparison.now_hit.len()
    )?;
    if args.json {
        let mut summary = comparison.to_json();
        summary["baseline"] = report.to_json();
        summary["candidate"] = tried.to_json();
        summary["source"] = source.into();
        outln!("{summary}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The config a replay runs with: the file in force, or the defaults where there is
/// none.
fn config_phrase(file: &ConfigFile) -> String {
    if file.path.exists() {
        file.path.display().to_string()
    } else {
        format!("defaults (no {})", file.path.display())
    }
}

/// The cases to replay (`--cases` or the stored sessions) and a phrase naming where
/// they came from.
async fn load_cases(app: &App, args: &Args) -> anyhow::Result<(Vec<Case>, String)> {
    Ok(match &args.cases {
        Some(path) => (read_cases(path)?, path.display().to_string()),
        None => {
            let cases =
                stored_cases(app, args.session.as_deref(), args.sessions, args.since_days).await?;
            let source = match &args.session {
                Some(id) => format!("session {id}"),
                None => format!(
                    "{} most recent sessions of the last {} days",
                    cases.len(),
                    args.since_days
                ),
            };
            (cases, source)
        }
    })
}

/// `--export`: the cases as JSON lines, to a file or (`-`) to stdout.
fn export_cases(path: &Path, cases: &[Case]) -> anyhow::Result<()> {
    let mut out: Box<dyn std::io::Write> = if path.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot write {}", path.display()))?,
        ))
    };
    for case in cases {
        writeln!(out, "{}", serde_json::to_string(case)?)?;
    }
    out.flush()?;
    if path.as_os_str() != "-" {
        eprintln!("{} sessions written to {}", cases.len(), path.display());
    }
    Ok(())
}

/// `router` with the dense stage attached (waited for) unless `lexical` or
/// `router_dense = off`, and a phrase saying which.
pub(super) async fn router_for(app: &App, router: Router, lexical: bool) -> (Arc<Router>, String) {
    let router = Arc::new(router);
    if lexical {
        return (router, "lexical only (--lexical)".to_owned());
    }
    let dense = match app.attach_dense_stage_to(router.clone()).await {
        Some(build) => {
            let built = tokio::task::spawn_blocking(move || build.join()).await;
            match built {
                Ok(Ok(Ok(_))) => "dense stage on".to_owned(),
                _ => "lexical only: the dense stage did not start (see the warning)".to_owned(),
            }
        }
        None => "lexical only (router_dense = off)".to_owned(),
    };
    (router, dense)
}

/// Every user message of `cases` embedded for `router`'s dense stage, all at once
/// through its encoder (as the server embeds each message before routing it);
/// `None` lexical-only, or when embedding failed (then the replay is lexical and a
/// warning says why).
pub(super) fn case_vectors(
    router: &Router,
    cases: &[Case],
    known: &HashMap<String, Vec<f32>>,
) -> Option<HashMap<String, loadout_router::MessageVectors>> {
    let encoder = loadout_embed::encoder_for(router.dense()?.model_id())?;
    let messages = cases
        .iter()
        .flat_map(|case| case.turns.iter().map(|turn| turn.user.as_str()));
    let (mut vectors, rest) = known_vectors(encoder.model_id(), messages, known);
    match crate::routing::off_worker(|| encoder.vectors_by_message(rest)) {
        Ok(embedded) => {
            vectors.extend(embedded);
            Some(vectors)
        }
        Err(e) => {
            tracing::warn!("messages not embedded ({e}); replaying lexical-only");
            None
        }
    }
}

/// The vectors of the messages that are one piece and whose vector `known` holds (the
/// learned memory keeps each entry's, of the dense stage's encoder), and the messages
/// left to embed: a refit on 20,000 turns need not embed them all again.
fn known_vectors<'a>(
    model_id: &str,
    messages: impl Iterator<Item = &'a str>,
    known: &HashMap<String, Vec<f32>>,
) -> (
    HashMap<String, loadout_router::MessageVectors>,
    Vec<&'a str>,
) {
    let mut vectors = HashMap::new();
    let mut rest = Vec::new();
    for message in messages {
        let pieces = loadout_router::message_pieces(message);
        match (pieces.as_slice(), known.get(message.trim())) {
            ([_], Some(vector)) => {
                let found = loadout_router::MessageVectors::new(model_id, vec![vector.clone()]);
                vectors.insert(message.to_owned(), found);
            }
            _ => rest.push(message),
        }
    }
    (vectors, rest)
}

/// The learned memory's vectors of `model_id`, by message (trimmed).
pub(super) async fn learned_vectors(
    app: &App,
    model_id: Option<&str>,
) -> HashMap<String, Vec<f32>> {
    let Some(model_id) = model_id else {
        return HashMap::new();
    };
    match app.store.learned_rows(None, Some(model_id)).await {
        // Vectors come only for entries of `model_id`.
        Ok(rows) => rows
            .into_iter()
            .filter_map(|row| Some((row.message.trim().to_owned(), row.vector?)))
            .collect(),
        Err(e) => {
            tracing::warn!("learned vectors not read ({e}); every message is embedded");
            HashMap::new()
        }
    }
}

pub(super) fn read_cases(path: &std::path::Path) -> anyhow::Result<Vec<Case>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    cases_from_json_lines(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The stored sessions as cases: `session` alone, else the most recently active
/// `sessions` of the last `since_days` days.
pub(super) async fn stored_cases(
    app: &App,
    session: Option<&str>,
    sessions: usize,
    since_days: u32,
) -> anyhow::Result<Vec<Case>> {
    let store = app.store();
    let ids = match session {
        Some(id) => {
            if !store.session_exists(id).await? {
                anyhow::bail!("no session `{id}`");
            }
            vec![id.to_owned()]
        }
        None => {
            let since = loadout_store::now_ms() - i64::from(since_days) * 86_400_000;
            store.sessions_active_since(since, sessions).await?
        }
    };
    let settings = app.settings.snapshot().await?;
    let mut unknown = 0;
    let mut cases = Vec::with_capacity(ids.len());
    for id in ids {
        let rows = store.messages(&id).await?;
        let turns = turns_of(&app.registry, &rows, &mut unknown);
        if turns.is_empty() {
            continue;
        }
        let activity = store
            .first_decision(&id)
            .await?
            .map(|row| logged_activity(&row.reasons));
        cases.push(Case {
            id,
            configured: Configured::Keys(configured_keys(
                &app.registry,
                &settings,
                activity.as_ref(),
            )),
            turns,
            why: None,
        });
    }
    if unknown > 0 {
        eprintln!(
            "loadout: {unknown} calls of tools this registry lacks were left out (removed \
             since, or of an upstream server that is not connected)"
        );
    }
    Ok(cases)
}

/// Which domains a logged decision names as active and as inactive.
#[derive(Debug, Default)]
struct LoggedActivity {
    active: BTreeSet<String>,
    inactive: BTreeSet<String>,
}

fn logged_activity(reasons: &Reasons) -> LoggedActivity {
    let mut activity = LoggedActivity {
        active: reasons.unmatched.iter().cloned().collect(),
        inactive: reasons.inactive.iter().cloned().collect(),
    };
    // Domains left out with a score (`near`, `no_tool_needed`) were active too.
    activity.active.extend(reasons.near.keys().cloned());
    activity
        .active
        .extend(reasons.no_tool_needed.keys().cloned());
    for domain in &reasons.domains {
        let side = if domain.stage == "inactive" {
            &mut activity.inactive
        } else {
            &mut activity.active
        };
        side.insert(domain.domain.clone());
    }
    activity
}

/// The settings keys a session routes with: the domains its first logged decision
/// names as active get their keys. Without a logged decision (`decision_log = off`),
/// and for domains the log does not name (added since), today's settings decide.
fn configured_keys(
    registry: &Registry,
    settings: &std::collections::BTreeMap<String, String>,
    logged: Option<&LoggedActivity>,
) -> Vec<String> {
    let mut keys = BTreeSet::new();
    for domain in registry.domains() {
        let active = match logged {
            Some(logged) if logged.inactive.contains(&domain.name) => false,
            Some(logged) if logged.active.contains(&domain.name) => true,
            _ => registry.missing_settings(&domain.name, settings).is_empty(),
        };
        if active {
            keys.extend(domain.settings_keys.iter().cloned());
        }
    }
    keys.into_iter().collect()
}

/// A session's user messages, each with the tools called with success in its turn:
/// `called` all the registry knows, `needed` those of optional domains (core is
/// always sent). Calls of tools the registry does not have (removed since, or of an
/// upstream server that is not connected) are counted in `unknown` and left out.
fn turns_of(registry: &Registry, rows: &[MessageRow], unknown: &mut usize) -> Vec<CaseTurn> {
    // (turn, message, tools called in it)
    let mut turns: Vec<(i64, String, Vec<String>)> = Vec::new();
    for row in rows {
        if row.role == "user" {
            let user = match &row.content {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            turns.push((row.turn, user, Vec::new()));
            continue;
        }
        let Some(name) = called_tool(&row.role, &row.content) else {
            continue;
        };
        if registry.tool(name).is_none() {
            *unknown += 1;
            continue;
        }
        if let Some((_, _, called)) = turns.iter_mut().rev().find(|(t, _, _)| *t == row.turn)
            && !called.iter().any(|c| c == name)
        {
            called.push(name.to_owned());
        }
    }
    turns
        .into_iter()
        .map(|(_, user, called)| {
            let needed = called
                .iter()
                .filter(|name| {
                    registry
                        .tool(name)
                        .and_then(|tool| registry.domain(&tool.domain))
                        .is_some_and(|d| !d.always_on)
                })
                .cloned()
                .collect();
            CaseTurn {
                user,
                needed,
                called: Some(called),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-piece message whose vector the learned memory keeps is not embedded
    /// again; a message of several requests, or one never learned, is.
    #[test]
    fn learned_vectors_spare_embedding_one_piece_messages() {
        let chained = "create a table of my runs, then send the summary to bob by email";
        assert!(
            loadout_router::message_pieces(chained).len() > 1,
            "the test needs a message of several pieces"
        );
        let known: HashMap<String, Vec<f32>> = [
            ("make a table of my runs".to_owned(), vec![3.0, 4.0]),
            (chained.to_owned(), vec![1.0, 0.0]),
        ]
        .into();
        let messages = ["  make a table of my runs ", chained, "never learned"];
        let (vectors, rest) = super::known_vectors("m", messages.into_iter(), &known);
        assert_eq!(rest, [chained, "never learned"]);
        let found = &vectors["  make a table of my runs "];
        assert_eq!(found.model_id(), "m");
        assert_eq!(found.pieces(), [vec![0.6, 0.8]], "normalised");
        assert_eq!(vectors.len(), 1);
    }

    #[test]
    fn a_logged_decision_names_active_and_inactive_domains_in_every_form() {
        // Every place a row puts a domain: in full, by name, or by name and score.
        let reasons = serde_json::json!({
            "domains": [
                {"domain": "weather", "included": true, "stage": "keyword", "score": 0.8, "reason": "a keyword matched"},
                {"domain": "email", "included": false, "stage": "inactive", "score": 0.2, "reason": "missing settings: smtp_host"}
            ],
            "inactive": ["calendar"],
            "unmatched": ["docker"],
            "near": {"git": 0.12},
            "no_tool_needed": {"memory": 0.0},
            "tools": []
        });
        let reasons: Reasons = serde_json::from_value(reasons).expect("reasons");
        let activity = logged_activity(&reasons);
        let names = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>();
        assert_eq!(
            names(&activity.active),
            ["docker", "git", "memory", "weather"]
        );
        assert_eq!(names(&activity.inactive), ["calendar", "email"]);
    }
}
