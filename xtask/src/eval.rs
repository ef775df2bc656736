//! `cargo xtask eval`: replays labeled conversations through the router, turn by turn,
//! and reports recall, tools and tokens sent, and every miss with the router's reasons.
//!
//! The session is fed exactly as the server feeds it: the same [`SessionView`] updates
//! (`begin_turn`, `record_calls`), kept in memory instead of the store.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use loadout::Registry;
use loadout::router::{RouteInput, Router, RouterConfig, Selection, SessionView, Stage};
use serde::Deserialize;

const USAGE: &str = "usage: cargo xtask eval --catalog DIR --cases FILE [--json] [--verbose]
       [--min-turn-recall X] [--config ROUTER_CONFIG.json] [--budget TOKENS]
       [--embedder builtin|none] [--vector-cache DIR|none] [--tool-ranks]
  --embedder      the dense stage: the built-in encoder (default when built with the
                  `dense` feature) or none (lexical only)
  --vector-cache  where tool vectors are cached (default target/vector-cache)
  --tool-ranks    also report how often every needed tool of a turn is among the k
                  best of the message-only tool ranking (`search_tools`)";

#[derive(Debug, Deserialize)]
struct Case {
    id: String,
    configured: Configured,
    turns: Vec<Turn>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Configured {
    /// `"all"`: every settings key of every domain has a value.
    All(String),
    Keys(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct Turn {
    user: String,
    needed: Vec<String>,
    called: Option<Vec<String>>,
}

struct Options {
    catalog: PathBuf,
    cases: PathBuf,
    json: bool,
    verbose: bool,
    tool_ranks: bool,
    min_turn_recall: Option<f64>,
    config: RouterConfig,
    budget: Option<usize>,
    embedder: EmbedderChoice,
    vector_cache: Option<PathBuf>,
}

/// Which dense stage `eval` and `bench` run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedderChoice {
    None,
    Builtin,
}

impl EmbedderChoice {
    pub fn default_for_build() -> EmbedderChoice {
        if loadout::embed::builtin_available() {
            EmbedderChoice::Builtin
        } else {
            EmbedderChoice::None
        }
    }

    pub fn parse(text: &str) -> anyhow::Result<EmbedderChoice> {
        match text {
            "none" | "lexical" => Ok(EmbedderChoice::None),
            "builtin" => Ok(EmbedderChoice::Builtin),
            other => bail!("--embedder {other}: expected builtin or none"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            EmbedderChoice::None => "none (lexical only)",
            EmbedderChoice::Builtin => "builtin",
        }
    }
}

/// The default vector cache of the xtasks: `target/vector-cache` of this workspace.
pub fn default_vector_cache() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("vector-cache")
}

/// Attaches the chosen dense stage to `router`, synchronously. Returns a line for the
/// report.
pub fn attach_embedder(
    router: &Router,
    choice: EmbedderChoice,
    vector_cache: Option<&std::path::Path>,
) -> anyhow::Result<String> {
    match choice {
        EmbedderChoice::None => Ok("embedder none (lexical only)".to_owned()),
        EmbedderChoice::Builtin => {
            let started = Instant::now();
            let embedder = loadout::embed::builtin().map_err(anyhow::Error::msg)?;
            let load_ms = started.elapsed().as_secs_f64() * 1e3;
            let mut cache =
                vector_cache.map(|dir| loadout::embed::VectorCache::open(dir, embedder.model_id()));
            let (index, stats) =
                loadout::embed::build_dense_index(router, embedder, cache.as_mut())
                    .map_err(anyhow::Error::msg)?;
            if let Some(cache) = &mut cache {
                cache
                    .save()
                    .with_context(|| format!("writing {}", cache.path().display()))?;
            }
            let model_id = index.model_id().to_owned();
            router
                .attach_dense(index)
                .map_err(|_| anyhow::anyhow!("dense stage already attached"))?;
            Ok(format!(
                "embedder {model_id}: loaded in {load_ms:.0} ms; {} texts, {} cached, {} embedded in {:.1} s",
                stats.n_texts,
                stats.n_cached,
                stats.n_embedded,
                stats.elapsed.as_secs_f64()
            ))
        }
    }
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut catalog = None;
    let mut cases = None;
    let mut json = false;
    let mut verbose = false;
    let mut tool_ranks = false;
    let mut min_turn_recall = None;
    let mut config = RouterConfig::default();
    let mut budget = None;
    let mut embedder = EmbedderChoice::default_for_build();
    let mut vector_cache = Some(default_vector_cache());
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .cloned()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--catalog" => catalog = Some(PathBuf::from(value("--catalog")?)),
            "--cases" => cases = Some(PathBuf::from(value("--cases")?)),
            "--json" => json = true,
            "--verbose" | "-v" => verbose = true,
            "--tool-ranks" => tool_ranks = true,
            "--min-turn-recall" => {
                let text = value("--min-turn-recall")?;
                min_turn_recall = Some(
                    text.parse()
                        .with_context(|| format!("--min-turn-recall {text}: not a number"))?,
                );
            }
            "--budget" => {
                let text = value("--budget")?;
                budget = Some(
                    text.parse()
                        .with_context(|| format!("--budget {text}: not a number"))?,
                );
            }
            "--embedder" => embedder = EmbedderChoice::parse(&value("--embedder")?)?,
            "--vector-cache" => {
                let dir = value("--vector-cache")?;
                vector_cache = (dir != "none").then(|| PathBuf::from(dir));
            }
            "--config" => {
                let path = value("--config")?;
                let text =
                    std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
                config = serde_json::from_str(&text).with_context(|| format!("parsing {path}"))?;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    Ok(Options {
        catalog: catalog.with_context(|| format!("--catalog is required\n{USAGE}"))?,
        cases: cases.with_context(|| format!("--cases is required\n{USAGE}"))?,
        json,
        verbose,
        tool_ranks,
        min_turn_recall,
        config,
        budget,
        embedder,
        vector_cache,
    })
}

/// One turn whose needed tools were not all sent.
struct Miss {
    case_id: String,
    turn: usize,
    message: String,
    missing: Vec<String>,
    explanation: Vec<String>,
    summary: String,
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = parse_args(args)?;
    let started = Instant::now();
    let registry = Registry::builder()
        .toolkit_dir(&options.catalog)
        .with_context(|| format!("loading catalog {}", options.catalog.display()))?
        .build()
        .context("building the registry")?;
    let registry = Arc::new(registry);
    let router = Router::new(registry.clone(), options.config.clone());
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let embedder_line =
        attach_embedder(&router, options.embedder, options.vector_cache.as_deref())?;

    let cases_text = std::fs::read_to_string(&options.cases)
        .with_context(|| format!("reading {}", options.cases.display()))?;
    let mut cases = Vec::new();
    for (line_no, line) in cases_text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let case: Case = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not a case", options.cases.display(), line_no + 1))?;
        cases.push(case);
    }

    let all_keys: Vec<String> = registry
        .domains()
        .iter()
        .flat_map(|d| d.settings_keys.iter().cloned())
        .collect();

    let mut n_turns = 0usize;
    let mut n_hits = 0usize;
    let mut n_needed = 0usize;
    let mut n_needed_sent = 0usize;
    let mut tools_per_turn = Vec::new();
    let mut tokens_per_turn = Vec::new();
    let mut hint_tokens_total = 0usize;
    let mut misses = Vec::new();
    let mut route_time = std::time::Duration::ZERO;
    // Per turn with needed tools: the worst rank of a needed tool in the message-only
    // tool ranking (`search_tools`), `usize::MAX` when one is not ranked at all.
    let mut worst_ranks: Vec<usize> = Vec::new();

    for case in &cases {
        let keys: &[String] = match &case.configured {
            Configured::All(word) if word == "all" => &all_keys,
            Configured::All(word) => bail!(
                "case {}: configured must be \"all\" or a list, got {word:?}",
                case.id
            ),
            Configured::Keys(keys) => keys,
        };
        let settings: BTreeMap<String, String> =
            keys.iter().map(|k| (k.clone(), "set".to_owned())).collect();
        let mut view = SessionView::new(0);
        let mut previous: Option<Selection> = None;
        for (turn_idx, turn) in case.turns.iter().enumerate() {
            view.begin_turn(turn_idx as i64 + 1, previous.as_ref());
            let input = RouteInput {
                message: &turn.user,
                settings: &settings,
                session: &view,
                token_budget: options.budget,
            };
            if options.tool_ranks && !turn.needed.is_empty() {
                let ranking = router.search(&turn.user, Some(&settings), usize::MAX);
                let worst = turn
                    .needed
                    .iter()
                    .map(|needed| {
                        ranking
                            .iter()
                            .position(|hint| hint.name == needed.as_str())
                            .map_or(usize::MAX, |rank| rank + 1)
                    })
                    .max()
                    .unwrap_or(0);
                worst_ranks.push(worst);
            }
            let routed_at = Instant::now();
            let selection = router.select(&input);
            route_time += routed_at.elapsed();

            n_turns += 1;
            n_needed += turn.needed.len();
            let missing: Vec<String> = turn
                .needed
                .iter()
                .filter(|t| !selection.contains(t))
                .cloned()
                .collect();
            n_needed_sent += turn.needed.len() - missing.len();
            if missing.is_empty() {
                n_hits += 1;
            } else {
                misses.push(Miss {
                    case_id: case.id.clone(),
                    turn: turn_idx + 1,
                    message: turn.user.clone(),
                    explanation: explain(&registry, &selection, &missing),
                    missing,
                    summary: selection.summary_line(),
                });
            }
            if options.verbose {
                println!(
                    "{} #{} {:?}\n    {}",
                    case.id,
                    turn_idx + 1,
                    turn.user,
                    selection.summary_line()
                );
            }
            tools_per_turn.push(selection.n_tools);
            tokens_per_turn.push(selection.tokens);
            hint_tokens_total += selection.hint_tokens;

            let called = turn.called.as_ref().unwrap_or(&turn.needed);
            view.record_calls(&router, called);
            previous = Some(selection);
        }
    }

    let ratio = |num: usize, den: usize| {
        if den == 0 {
            1.0
        } else {
            num as f64 / den as f64
        }
    };
    let turn_recall = ratio(n_hits, n_turns);
    let tool_recall = ratio(n_needed_sent, n_needed);
    let mean_tools = mean(&tools_per_turn);
    let mean_tokens = mean(&tokens_per_turn);
    let all_tools_tokens = router.all_tools_tokens();
    let mean_tokens_pct = 100.0 * mean_tokens / all_tools_tokens.max(1) as f64;
    let mean_route_us = route_time.as_secs_f64() * 1e6 / n_turns.max(1) as f64;

    println!(
        "eval {} on {} ({} domains, {} tools; router built in {build_ms:.0} ms)",
        options.cases.display(),
        options.catalog.display(),
        registry.domains().len(),
        registry.all_tools().len()
    );
    println!("{embedder_line}");
    for miss in &misses {
        println!(
            "MISS {} turn {}: {:?}\n  missing: {}\n  {}",
            miss.case_id,
            miss.turn,
            miss.message,
            miss.missing.join(", "),
            miss.summary
        );
        for line in &miss.explanation {
            println!("    {line}");
        }
    }
    println!(
        "turns {n_turns}  turn_recall {turn_recall:.3}  tool_recall {tool_recall:.3}  mean_tools {mean_tools:.1}  p95_tools {}  \
         mean_tokens {mean_tokens:.0} ({mean_tokens_pct:.1}% of {all_tools_tokens})  p95_tokens {}  mean_hint_tokens {:.0}  \
         route {mean_route_us:.0} us/turn (this build)",
        p95(&tools_per_turn),
        p95(&tokens_per_turn),
        hint_tokens_total as f64 / n_turns.max(1) as f64,
    );
    if options.tool_ranks {
        let n = worst_ranks.len().max(1) as f64;
        let at = |k: usize| worst_ranks.iter().filter(|&&r| r <= k).count() as f64 / n;
        println!(
            "tool ranking (message only, {} turns with needed tools): R@3 {:.3}  R@5 {:.3}  R@8 {:.3}  R@10 {:.3}  R@15 {:.3}  R@20 {:.3}  R@30 {:.3}",
            worst_ranks.len(),
            at(3),
            at(5),
            at(8),
            at(10),
            at(15),
            at(20),
            at(30)
        );
    }
    if options.json {
        let summary = serde_json::json!({
            "cases": options.cases.display().to_string(),
            "catalog": options.catalog.display().to_string(),
            "turns": n_turns,
            "hits": n_hits,
            "turn_recall": turn_recall,
            "tool_recall": tool_recall,
            "mean_tools": mean_tools,
            "p95_tools": p95(&tools_per_turn),
            "mean_tokens": mean_tokens,
            "p95_tokens": p95(&tokens_per_turn),
            "all_tools_tokens": all_tools_tokens,
            "mean_tokens_pct": mean_tokens_pct,
            "misses": misses.len(),
            "embedder": options.embedder.name(),
        });
        println!("{summary}");
    }
    if let Some(min) = options.min_turn_recall
        && turn_recall < min
    {
        bail!("turn recall {turn_recall:.3} is below the gate {min:.3}");
    }
    Ok(())
}

/// For each missing tool: its domain's decision and, when the domain was ranked tool
/// by tool, where the tool ranked.
fn explain(registry: &Registry, selection: &Selection, missing: &[String]) -> Vec<String> {
    let mut lines = Vec::new();
    for name in missing {
        let Some(tool) = registry.tool(name) else {
            lines.push(format!("{name}: not in the catalog"));
            continue;
        };
        let domain_line = match selection.domain(&tool.domain) {
            Some(d) => format!(
                "{name}: domain {} {} ({}:{:.2}) {}",
                d.domain,
                if d.included { "included" } else { "excluded" },
                d.stage,
                d.score,
                d.reason
            ),
            None => format!("{name}: domain {} has no decision", tool.domain),
        };
        lines.push(domain_line);
        if let Some(decision) = selection.tool_decisions.iter().find(|d| d.tool == *name) {
            let rank = selection
                .tool_decisions
                .iter()
                .filter(|d| {
                    d.domain == tool.domain && d.stage == Stage::Ranked && d.score > decision.score
                })
                .count();
            let mut above: Vec<&loadout::router::ToolDecision> = selection
                .tool_decisions
                .iter()
                .filter(|d| d.domain == tool.domain && d.score > decision.score)
                .collect();
            above.sort_by(|a, b| b.score.total_cmp(&a.score));
            let above: Vec<String> = above
                .iter()
                .take(5)
                .map(|d| format!("{}:{:.2}", d.tool, d.score))
                .collect();
            lines.push(format!(
                "  tool {}:{:.2}, rank {} in its domain; above: {}",
                decision.stage,
                decision.score,
                rank + 1,
                above.join(" ")
            ));
        }
    }
    lines
}

fn mean(values: &[usize]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<usize>() as f64 / values.len() as f64
}

fn p95(values: &[usize]) -> usize {
    if values.is_empty() {
        return 0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let idx = ((sorted.len() as f64) * 0.95).ceil() as usize;
    sorted[idx.clamp(1, sorted.len()) - 1]
}
