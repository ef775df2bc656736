//! Fitting the scorer (`scorer.rs`) on labeled conversations, with k folds by
//! conversation: `cargo xtask fit` on the shared eval set, `loadout fit` on a
//! deployment's own stored sessions.
//!
//! Each fold's feature rows are computed with the other folds as the learned memory,
//! so the learned and co-usage features are what a deployment would see on
//! conversations it never learned from. Each fold is then routed with weights fitted
//! on the other folds only; the selection rule (`SelectionRule`) is chosen on those
//! held-out routings, and the final weights are fitted on every fold's rows.

use std::collections::HashMap;

use crate::replay::{Case, Replayed, Report, all_but, learned_turns, replay, replay_by};
use crate::scorer::{self, Model, Row, SelectionRule, Weights};
use crate::stages::Pass;
use crate::{LearnedEntry, LearnedIndex, MessageVectors, RouteInput, Router, Scorers, SessionView};

/// A turn of recall is worth this many tools sent when the selection rule is chosen:
/// recall first, but a rule that sends 15 more tools for one turn in 300 loses.
pub const TOOLS_PER_TURN_OF_RECALL: f64 = 0.002;

/// Most turns the selection rule is chosen on (see [`sample_folds`]).
const RULE_TURNS: usize = 4000;

/// Most bytes of first-turn scorings the rule search keeps (see `search_rule`).
const KEPT_SCORING_BYTES: usize = 512 << 20;

/// Which of the router's models a fit replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Lexical,
    Dense,
    /// The dense path of a joined stage (`DenseIndex::joined`): the router must have
    /// one attached.
    Joined,
}

/// One path's fitted model, with the held-out figures it was chosen on.
#[derive(Debug, Clone)]
pub struct Fitted {
    pub model: Model,
    /// Every fold routed with the weights fitted on the other folds.
    pub held_out: Report,
    /// The same folds routed with the weights the router had before the fit.
    pub before: Report,
    /// For the weights file: rows, figures, one line a fold.
    pub summary: serde_json::Value,
}

/// What a fit aims at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// L2 penalty on the weights.
    pub l2: f64,
    /// The most tools the selection rule may send a turn on average: a client's cap,
    /// or an operator's price for tokens. None: [`TOOLS_PER_TURN_OF_RECALL`] alone
    /// weighs tools against recall.
    pub max_mean_tools: Option<f64>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            l2: 1.0,
            max_mean_tools: None,
        }
    }
}

impl Options {
    /// What a fit's held-out routings are judged by: turn recall, less
    /// [`TOOLS_PER_TURN_OF_RECALL`] a tool sent. Routings that send more than
    /// `max_mean_tools` lose to every routing that does not, and to those that send
    /// fewer.
    pub fn objective(&self, report: &Report) -> f64 {
        let tools = report.mean_tools();
        match self.max_mean_tools {
            Some(most) if tools > most => -1e6 - tools,
            _ => report.turn_recall() - TOOLS_PER_TURN_OF_RECALL * tools,
        }
    }
}

/// A job of the fit: it runs once, on any thread.
pub type Job<'j> = Box<dyn FnOnce() + Send + 'j>;

/// Runs the fit's independent jobs and returns once every one has run: one after
/// another ([`one_after_another`]), or side by side on threads the caller starts
/// (the router starts none).
pub type RunJobs<'r> = &'r (dyn for<'j> Fn(Vec<Job<'j>>) + Sync);

/// Runs the jobs in order on this thread.
pub fn one_after_another(jobs: Vec<Job<'_>>) {
    for job in jobs {
        job();
    }
}

/// Fits `path`'s model on `folds` (see [`crate::replay::folds`]). `vectors`: each
/// message's vectors (the dense path needs them; the lexical path ignores them).
/// `log` sees a line per step; `run` runs the independent fits (see [`RunJobs`]).
pub fn fit_path(
    router: &Router,
    folds: &[Vec<Case>],
    options: &Options,
    path: Path,
    vectors: Option<&HashMap<String, MessageVectors>>,
    log: &mut dyn FnMut(String),
    run: RunJobs<'_>,
) -> Result<Fitted, String> {
    if folds.len() < 2 {
        return Err("a fit needs 2 folds or more".to_owned());
    }
    let vectors = match path {
        Path::Lexical => None,
        Path::Dense | Path::Joined => vectors,
    };
    if path == Path::Joined && !router.dense().is_some_and(|d| d.is_joined()) {
        return Err("the joined path needs a joined dense stage attached".to_owned());
    }
    let started = std::time::Instant::now();
    let data = fold_data(router, folds, vectors, run)?;
    let n_rows: usize = data.iter().map(|d| d.rows.len()).sum();
    let n_positive: usize = data
        .iter()
        .map(|d| d.labels.iter().filter(|&&l| l).count())
        .sum();
    if n_positive == 0 {
        return Err("no turn called a tool: nothing to fit".to_owned());
    }
    log(format!(
        "{path:?}: {n_rows} rows ({n_positive} positive) from {} folds in {:.1} s",
        folds.len(),
        started.elapsed().as_secs_f64()
    ));

    // The rule is chosen on at most `RULE_TURNS` turns: six parameters need no more,
    // and routing every turn of a large history once per rule tried would be most of
    // the fit's time. The weights are fitted on every row.
    let sample = sample_folds(folds, RULE_TURNS);
    let n_sampled: usize = sample.iter().flatten().map(|c| c.turns.len()).sum();
    let n_turns: usize = folds.iter().flatten().map(|c| c.turns.len()).sum();
    if n_sampled < n_turns {
        log(format!(
            "{path:?}: the selection rule is chosen on {n_sampled} of {n_turns} turns"
        ));
    }
    let folds = &sample[..];
    let shipped = router.weights().clone();
    let before = route_folds(router, folds, &data, vectors)?;

    // The weights written, fitted on every fold; then per fold, weights fitted on the
    // other folds, each starting from those (independent fits: `run` may run them
    // side by side).
    let (bias, weights) = scorer::fit_parts(&pooled(&data, None), options.l2);
    let held_out: Vec<(f32, Row)> = each(folds.len(), run, |f| {
        scorer::fit_parts_from(&pooled(&data, Some(f)), options.l2, Some((bias, &weights)))
    })?;
    let weights_for = |f: usize, rule: SelectionRule| {
        let (bias, row) = &held_out[f];
        with_model(&shipped, path, Model::from_row(*bias, row, rule))
    };
    let start = match path {
        Path::Lexical => shipped.lexical.selection,
        Path::Dense => shipped.dense.selection,
        Path::Joined => shipped.joined.as_ref().unwrap_or(&shipped.dense).selection,
    };
    let RuleFound {
        rule,
        total,
        per_fold,
        tried,
    } = search_rule(router, folds, &data, vectors, start, options, weights_for)?;
    log(format!("{path:?}: chosen rule {rule:?} of {tried} tried"));
    if let Some(most) = options
        .max_mean_tools
        .filter(|&most| total.mean_tools() > most)
    {
        log(format!(
            "{path:?}: no rule tried sends at most {most} tools a turn; the fewest sent {:.1} \
             (core tools and hard rules count)",
            total.mean_tools()
        ));
    }
    let fold_lines = fold_lines(&per_fold, &total, &before, log);

    let model = Model::from_row(bias, &weights, rule);
    let mut summary = serde_json::json!({
        "rows": n_rows,
        "positive": n_positive,
        "turn_recall": (total.turn_recall() * 1000.0).round() / 1000.0,
        "mean_tools": (total.mean_tools() * 10.0).round() / 10.0,
        "folds": fold_lines,
    });
    // The dense weights hold for the encoder whose cosines they were fitted on
    // (`Router::dense_weights_mismatch`).
    if let (Path::Dense | Path::Joined, Some(dense)) = (path, router.dense()) {
        summary["encoder"] = dense.model_id().into();
    }
    Ok(Fitted {
        model,
        held_out: total,
        before,
        summary,
    })
}

/// A line a fold, then the folds together and the same folds before the fit, each
/// logged; the folds' lines are returned for the weights file.
fn fold_lines(
    per_fold: &[Report],
    total: &Report,
    before: &Report,
    log: &mut dyn FnMut(String),
) -> Vec<String> {
    let mut lines = Vec::new();
    for (f, report) in per_fold.iter().enumerate() {
        let line = format!("fold {f}: {}", report.figures_line());
        log(format!("  {line}"));
        lines.push(line);
    }
    log(format!("  all folds: {}", total.figures_line()));
    log(format!(
        "  with the weights before the fit: {}",
        before.figures_line()
    ));
    lines
}

/// `weights` with `path`'s model replaced.
pub fn with_model(weights: &Weights, path: Path, model: Model) -> Weights {
    let mut weights = weights.clone();
    match path {
        Path::Lexical => weights.lexical = model,
        Path::Dense => weights.dense = model,
        Path::Joined => weights.joined = Some(model),
    }
    weights
}

/// The feature rows and labels of one fold, and the learned memory it was routed with.
struct FoldData {
    rows: Vec<Row>,
    labels: Vec<bool>,
    learned: LearnedIndex,
    /// Per turn, when asked for ([`turn_rows`]).
    turns: Option<Vec<TurnRows>>,
}

/// One turn's candidate tools with their feature rows (in [`scorer::FEATURES`]
/// order), as the fit sees them: routed with the other folds as learned memory.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TurnRows {
    pub fold: usize,
    pub case: String,
    pub turn: usize,
    pub message: String,
    pub needed: Vec<String>,
    pub tools: Vec<String>,
    pub rows: Vec<Row>,
}

/// Every turn's feature rows, each fold with the other folds as its learned memory
/// (as [`fit_path`] computes them), for a study outside the fit: what another
/// feature would add, say. `vectors`: each message's vectors for the dense path.
pub fn turn_rows(
    router: &Router,
    folds: &[Vec<Case>],
    vectors: Option<&HashMap<String, MessageVectors>>,
    run: RunJobs<'_>,
) -> Result<Vec<TurnRows>, String> {
    let data = each(folds.len(), run, |f| {
        one_fold_data(router, folds, f, vectors, true)
    })?;
    let mut turns = Vec::new();
    for fold in data {
        turns.extend(fold?.turns.unwrap_or_default());
    }
    Ok(turns)
}

/// Each fold routed with the router's weights, collecting its feature rows with the
/// other folds as its learned memory; the folds are independent jobs for `run`.
fn fold_data(
    router: &Router,
    folds: &[Vec<Case>],
    vectors: Option<&HashMap<String, MessageVectors>>,
    run: RunJobs<'_>,
) -> Result<Vec<FoldData>, String> {
    each(folds.len(), run, |f| {
        one_fold_data(router, folds, f, vectors, false)
    })?
    .into_iter()
    .collect()
}

/// `job(i)` for each `i` below `n`, as jobs for `run`; an error if one did not run.
fn each<T: Send>(
    n: usize,
    run: RunJobs<'_>,
    job: impl Fn(usize) -> T + Sync,
) -> Result<Vec<T>, String> {
    let mut slots: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let job = &job;
    let jobs: Vec<Job<'_>> = slots
        .iter_mut()
        .enumerate()
        .map(|(i, slot)| Box::new(move || *slot = Some(job(i))) as Job<'_>)
        .collect();
    run(jobs);
    slots
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| "a job of the fit did not run".to_owned())
}

/// Fold `f` routed with the router's weights and the other folds as its learned
/// memory, with its feature rows.
fn one_fold_data(
    router: &Router,
    folds: &[Vec<Case>],
    f: usize,
    vectors: Option<&HashMap<String, MessageVectors>>,
    keep_turns: bool,
) -> Result<FoldData, String> {
    let others = all_but(folds, f);
    let learned = learned_index(router, &learned_turns(&others), vectors);
    let mut rows = Vec::new();
    let mut labels = Vec::new();
    let mut turns = keep_turns.then(Vec::new);
    let replayed = Replayed {
        cases: &folds[f],
        token_budget: None,
        learned: Some(&learned),
        vectors,
    };
    // Each turn's rows are those it is scored on; a chit-chat turn is scored on none,
    // yet its tools' rows are training data too.
    replay_by(
        router,
        &replayed,
        |case, turn, input| {
            let needed = &folds[f][case].turns[turn].needed;
            let scored = router.scored(input, &router.scorer);
            let mut this_turn = turns.as_ref().map(|_| TurnRows {
                fold: f,
                case: folds[f][case].id.clone(),
                turn,
                message: input.message.to_owned(),
                needed: needed.clone(),
                tools: Vec::new(),
                rows: Vec::new(),
            });
            let mut push = |t: usize, row: &Row| {
                let name = router.tool_name(t).unwrap_or("");
                labels.push(needed.iter().any(|n| n == name));
                rows.push(*row);
                if let Some(turn) = &mut this_turn {
                    turn.tools.push(name.to_owned());
                    turn.rows.push(*row);
                }
            };
            match scored.scored_rows() {
                Some(scored_rows) => scored_rows.for_each(|(t, row)| push(t, row)),
                None => router
                    .feature_rows(input)
                    .iter()
                    .for_each(|(t, row)| push(*t, row)),
            }
            if let (Some(turns), Some(turn)) = (&mut turns, this_turn) {
                turns.push(turn);
            }
            scored.select(&router.scorer)
        },
        |_| {},
    )?;
    Ok(FoldData {
        rows,
        labels,
        learned,
        turns,
    })
}

/// Each fold's conversations at an even stride, up to the fold's share of
/// `max_turns`: spread over the whole fold, and the same sample on every run.
fn sample_folds(folds: &[Vec<Case>], max_turns: usize) -> Vec<Vec<Case>> {
    let per_fold = max_turns / folds.len().max(1);
    folds
        .iter()
        .map(|fold| {
            let turns: usize = fold.iter().map(|c| c.turns.len()).sum();
            let stride = turns.div_ceil(per_fold.max(1)).max(1);
            fold.iter().step_by(stride).cloned().collect()
        })
        .collect()
}

/// Every fold's rows and labels but `except`'s (none past the last fold), in order.
fn pooled(data: &[FoldData], except: Option<usize>) -> Vec<(&[Row], &[bool])> {
    data.iter()
        .enumerate()
        .filter(|&(f, _)| Some(f) != except)
        .map(|(_, fold)| (&fold.rows[..], &fold.labels[..]))
        .collect()
}

/// Each fold routed with the router's weights and its learned memory.
fn route_folds(
    router: &Router,
    folds: &[Vec<Case>],
    data: &[FoldData],
    vectors: Option<&HashMap<String, MessageVectors>>,
) -> Result<Report, String> {
    let mut total = Report::default();
    for (f, fold) in folds.iter().enumerate() {
        total.absorb(replay(
            router,
            fold,
            None,
            Some(&data[f].learned),
            vectors,
            |_| {},
        )?);
    }
    Ok(total)
}

/// The selection rule a search chose, with its figures.
struct RuleFound {
    rule: SelectionRule,
    /// Every fold routed with the rule.
    total: Report,
    per_fold: Vec<Report>,
    /// How many rules were tried.
    tried: usize,
}

/// The selection rule ([`choose_rule`] from `start`), each fold routed with
/// `weights(fold, rule)` and its learned memory.
///
/// A case's first turn is scored once a fold and each rule selects from a copy (up to
/// [`KEPT_SCORING_BYTES`] of them): its session is empty whatever the rule, so only
/// the selection differs. Later turns are routed whole, since what the last turn sent
/// is carried into them. The first turns' inputs are built here as `replay_by` builds
/// them, because a scoring borrows its input and the replay's do not outlive a turn.
fn search_rule(
    router: &Router,
    folds: &[Vec<Case>],
    data: &[FoldData],
    vectors: Option<&HashMap<String, MessageVectors>>,
    start: SelectionRule,
    options: &Options,
    weights: impl Fn(usize, SelectionRule) -> Weights,
) -> Result<RuleFound, String> {
    let settings = folds
        .iter()
        .map(|fold| {
            fold.iter()
                .map(|case| case.settings(router.registry()))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    // As `replay` begins every case.
    let mut session = SessionView::new(0);
    session.begin_turn(1, None);
    let first_inputs: Vec<Vec<Option<RouteInput<'_>>>> = (0..folds.len())
        .map(|f| {
            folds[f]
                .iter()
                .zip(&settings[f])
                .map(|(case, settings)| {
                    case.turns.first().map(|turn| RouteInput {
                        message: &turn.user,
                        settings,
                        session: &session,
                        token_budget: None,
                        learned: Some(&data[f].learned),
                        vectors: vectors.and_then(|v| v.get(&turn.user)),
                    })
                })
                .collect()
        })
        .collect();
    let start_scorers: Vec<Scorers> = (0..folds.len())
        .map(|f| Scorers::new(&weights(f, start)))
        .collect();
    // Kept up to `KEPT_SCORING_BYTES`: on a catalog of thousands a scoring holds about
    // a megabyte, and the turns past the bound are routed whole.
    let mut kept_bytes = 0;
    let first_scored: Vec<Vec<Option<Pass<'_>>>> = first_inputs
        .iter()
        .zip(&start_scorers)
        .map(|(inputs, scorers)| {
            inputs
                .iter()
                .map(|input| {
                    let scored = router.scored(input.as_ref()?, scorers);
                    kept_bytes += scored.heap_bytes();
                    (kept_bytes <= KEPT_SCORING_BYTES).then_some(scored)
                })
                .collect()
        })
        .collect();

    let mut tried = 0;
    let (rule, (total, per_fold)) = choose_rule(start, options, |rule| {
        tried += 1;
        let mut total = Report::default();
        let mut per_fold = Vec::new();
        for (f, fold) in folds.iter().enumerate() {
            let scorers = Scorers::new(&weights(f, rule));
            let replayed = Replayed {
                cases: fold,
                token_budget: None,
                learned: Some(&data[f].learned),
                vectors,
            };
            let select = |case: usize, turn: usize, input: &RouteInput<'_>| {
                let first = first_scored[f].get(case).and_then(Option::as_ref);
                match first.filter(|_| turn == 0) {
                    Some(scored) => scored.clone().select(&scorers),
                    None => router.scored(input, &scorers).select(&scorers),
                }
            };
            let report = replay_by(router, &replayed, select, |_| {})?;
            per_fold.push(report.clone());
            total.absorb(report);
        }
        Ok((total, per_fold))
    })?;
    Ok(RuleFound {
        rule,
        total,
        per_fold,
        tried,
    })
}

/// The values each parameter of the selection rule may take.
fn rule_axes() -> [Vec<f32>; 6] {
    [
        vec![0.7, 0.9, 0.97],
        vec![0.01, 0.02, 0.05, 0.2],
        vec![0.001, 0.003, 0.01],
        vec![0.5, 0.8, 2.0],
        vec![0.0, 0.25, 0.5],
        vec![0.0, 500.0, 1000.0, 2500.0],
    ]
}

fn rule_get(rule: &SelectionRule, axis: usize) -> f32 {
    match axis {
        0 => rule.coverage,
        1 => rule.min_ratio,
        2 => rule.min_probability,
        3 => rule.whole_domain_ratio,
        4 => rule.whole_domain_share,
        _ => rule.fill_tokens as f32,
    }
}

fn rule_set(rule: &mut SelectionRule, axis: usize, value: f32) {
    match axis {
        0 => rule.coverage = value,
        1 => rule.min_ratio = value,
        2 => rule.min_probability = value,
        3 => rule.whole_domain_ratio = value,
        4 => rule.whole_domain_share = value,
        _ => rule.fill_tokens = value as usize,
    }
}

/// The selection rule by coordinate ascent over [`rule_axes`] from `start` (the rule
/// in force): each parameter in turn takes its best value with the others held, until
/// a pass changes nothing. About 14 routings of the folds a pass, where the whole
/// grid takes 1,296: a deployment's 20,000 turns fit in a minute.
fn choose_rule<T>(
    start: SelectionRule,
    options: &Options,
    mut route: impl FnMut(SelectionRule) -> Result<(Report, T), String>,
) -> Result<(SelectionRule, (Report, T)), String> {
    let mut best_rule = start;
    let mut best = route(best_rule)?;
    let mut best_score = options.objective(&best.0);
    for _pass in 0..4 {
        let mut changed = false;
        for (axis, values) in rule_axes().iter().enumerate() {
            for &value in values {
                if rule_get(&best_rule, axis) == value {
                    continue;
                }
                let mut rule = best_rule;
                rule_set(&mut rule, axis, value);
                let routed = route(rule)?;
                let score = options.objective(&routed.0);
                if score > best_score + 1e-9 {
                    (best_rule, best, best_score, changed) = (rule, routed, score, true);
                }
            }
        }
        if !changed {
            break;
        }
    }
    Ok((best_rule, best))
}

/// Past turns indexed for `router`, with the vectors its dense stage gave their
/// messages (the whole message's, the first piece).
pub fn learned_index(
    router: &Router,
    turns: &[LearnedEntry],
    vectors: Option<&HashMap<String, MessageVectors>>,
) -> LearnedIndex {
    let model_id = router.dense().map(|dense| dense.model_id().to_owned());
    let entries: Vec<LearnedEntry> = turns
        .iter()
        .map(|turn| LearnedEntry {
            vector: vectors
                .and_then(|v| v.get(&turn.message))
                .and_then(|v| v.pieces().first().cloned()),
            ..turn.clone()
        })
        .collect();
    LearnedIndex::new(router, model_id.as_deref(), &entries).remembering()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(hits: usize, turns: usize, tools: usize) -> Report {
        Report {
            turns,
            hits,
            tools_per_turn: vec![tools; turns],
            ..Report::default()
        }
    }

    /// Under a cap, any routing within it beats every routing above it, however much
    /// recall those buy, and above it fewer tools win; without one, recall less the
    /// price of the tools decides.
    #[test]
    fn a_routing_over_the_cap_loses_to_any_under_it() {
        let (few, many, more) = (
            report(80, 100, 10),
            report(99, 100, 30),
            report(99, 100, 40),
        );
        let capped = Options {
            max_mean_tools: Some(20.0),
            ..Options::default()
        };
        assert!(capped.objective(&few) > capped.objective(&many));
        assert!(capped.objective(&many) > capped.objective(&more));
        let priced = Options::default();
        assert!(priced.objective(&many) > priced.objective(&few));
        assert!(priced.objective(&many) > priced.objective(&more));
    }
}
