//! `cargo xtask bench`: routing time per message, side by side with the naive
//! reference router (for every domain, for every keyword,
//! `message.to_lowercase().contains(keyword)`), measured in the same run.
//!
//! Catalogs: the shared eval catalog with the dev messages, and a synthetic catalog of
//! 1,000 tools in 40 domains generated deterministically here, at 1x, 4x and 16x its
//! keywords. Numbers are only meaningful from a release build:
//! `cargo run --release -p xtask -- bench`. Nothing here asserts on time.
//!
//! With `--embedder builtin` (the default in a build with the `dense` feature) it also
//! measures the dense stage: routing time per dev message with its vectors given
//! (the router alone), with the encoder run for it (one call for the message and its
//! requests) and with its vectors in the message cache; the time to embed every tool text of
//! the shared catalog (262 tools) and of Seal-Tools (4,077 tools), and cold start
//! (router + encoder + vectors) with and without the vector cache.
//!
//! Without `--quick`, the fit on 20,000 labeled turns (`cargo xtask fit` on MetaTool's
//! history). Then the decision log's writes on SQLite, per row, for one-off and session
//! rows (see `bench_log.rs`).

use std::collections::HashMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use loadout::Registry;
use loadout_router::{RouteInput, Router, RouterConfig, Selection, SessionView};
use loadout_store::{DecisionRow, MessageLogging};

use crate::eval::{EmbedderChoice, attach_embedder};

const SHARED_CATALOG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/eval/catalog");
const SHARED_CASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/eval/dev.jsonl");
const METATOOL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/eval/public/metatool"
);
const SEAL_CATALOG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/eval/public/sealtools/catalog"
);

/// `cargo xtask bench`'s options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Fewer rounds: a quick look, not a measurement.
    #[arg(long)]
    quick: bool,
    /// The catalog routed over (default the shared eval catalog beside this workspace).
    #[arg(long, value_name = "DIR", default_value = SHARED_CATALOG, hide_default_value = true)]
    catalog: PathBuf,
    /// The labeled conversations whose messages are routed (default the shared dev
    /// set).
    #[arg(long, value_name = "FILE", default_value = SHARED_CASES, hide_default_value = true)]
    cases: PathBuf,
    /// Also time the dense stage with the built-in encoder, or not (none).
    #[arg(long, value_name = "builtin|none", value_parser = timed_embedder,
          default_value_t = EmbedderChoice::default_for_build())]
    embedder: EmbedderChoice,
}

/// `--embedder`: the bench times the built-in encoder, so an endpoint is refused.
fn timed_embedder(text: &str) -> anyhow::Result<EmbedderChoice> {
    match EmbedderChoice::parse(text)? {
        EmbedderChoice::Endpoint { .. } => {
            anyhow::bail!("the bench times the built-in encoder; give builtin or none")
        }
        choice => Ok(choice),
    }
}

pub fn run(options: &Args) -> anyhow::Result<()> {
    let rounds = if options.quick { 3 } else { 30 };
    if cfg!(debug_assertions) {
        println!("note: debug build; use `cargo run --release -p xtask -- bench` for real numbers");
    }
    println!(
        "{:<34} {:>6} {:>7} {:>9} {:>11} {:>11} {:>11} {:>11} {:>7} {:>12} {:>7}",
        "catalog",
        "tools",
        "domains",
        "keywords",
        "router p50",
        "router p95",
        "naive p50",
        "naive p95",
        "speedup",
        "kw-stage p50",
        "speedup"
    );
    println!(
        "(router: the whole selection; kw-stage: its keyword stage alone, the job the naive baseline does; speedup = naive p50 / ours)"
    );

    let registry = Registry::builder()
        .toolkit_dir(&options.catalog)
        .with_context(|| format!("loading {}", options.catalog.display()))?
        .build()?;
    let messages = dev_messages(&options.cases)?;
    let registry = Arc::new(registry);
    let decision_rows = bench_one(
        "shared catalog (dev messages)",
        registry.clone(),
        &messages,
        rounds,
    )?;
    if options.embedder == EmbedderChoice::Builtin {
        bench_dense(
            options,
            registry.clone(),
            &messages,
            EmbedderChoice::Builtin,
        )?;
        bench_dense(options, registry.clone(), &messages, EmbedderChoice::Static)?;
        if let Some(model) = std::env::var_os("LOADOUT_E5_MODEL") {
            bench_e5(
                options,
                registry.clone(),
                &messages,
                std::path::Path::new(&model),
            )?;
        }
    }
    bench_learned(options, registry, &messages)?;

    let synthetic_messages = synthetic_messages(200);
    for scale in [1usize, 4, 16] {
        let registry = synthetic_registry(40, 25, 15 * scale)?;
        bench_one(
            &format!("synthetic 1,000 tools, {scale}x keywords"),
            Arc::new(registry),
            &synthetic_messages,
            rounds,
        )?;
    }
    // Scale: a public catalog of 4,077 tools with its own messages (never tuned to).
    let seal_cases = std::path::Path::new(SEAL_CATALOG).with_file_name("cases.jsonl");
    if std::path::Path::new(SEAL_CATALOG).is_dir() && seal_cases.is_file() {
        let registry = Registry::builder()
            .toolkit_dir(std::path::Path::new(SEAL_CATALOG))
            .context("loading Seal-Tools")?
            .build()?;
        let mut messages = dev_messages(&seal_cases)?;
        messages.truncate(200);
        bench_one(
            "Seal-Tools (its messages)",
            Arc::new(registry),
            &messages,
            rounds,
        )?;
    }
    if !options.quick {
        bench_fit(options)?;
    }
    crate::bench_log::run(&decision_rows, if options.quick { 40 } else { 200 })?;
    Ok(())
}

/// The fit on 20,000 entries: `cargo xtask fit` on MetaTool's history (20,431
/// labeled past queries), 5 folds, both paths side by side as the command runs them.
/// The messages' vectors come from the vector cache, filled first and timed apart.
fn bench_fit(options: &Args) -> anyhow::Result<()> {
    let catalog = std::path::Path::new(METATOOL).join("catalog");
    let history = std::path::Path::new(METATOOL).join("history.jsonl");
    if !catalog.is_dir() || !history.is_file() {
        println!("fit: skipped, no MetaTool history beside this workspace");
        return Ok(());
    }
    let registry = Arc::new(Registry::builder().toolkit_dir(&catalog)?.build()?);
    let text = std::fs::read_to_string(&history)?;
    let cases = loadout_router::replay::cases_from_json_lines(&text).map_err(anyhow::Error::msg)?;
    let n_turns: usize = cases.iter().map(|c| c.turns.len()).sum();
    let lexical_only = options.embedder == EmbedderChoice::None;
    let mut vectors_time = Duration::ZERO;
    if !lexical_only {
        let router = Router::new(registry, crate::eval::eval_config());
        let cache = crate::eval::default_vector_cache();
        attach_embedder(&router, &EmbedderChoice::Builtin, Some(&cache))?;
        let started = Instant::now();
        crate::eval::case_vectors(&router, &cases, Some(&cache))?;
        vectors_time = started.elapsed();
    }
    let out = std::env::temp_dir().join(format!("loadout-bench-fit-{}.json", std::process::id()));
    let args = crate::fit::Args::for_bench(catalog, history, out.clone(), lexical_only);
    let started = Instant::now();
    let fitted = crate::fit::run(&args);
    let fit_time = started.elapsed();
    let _ = std::fs::remove_file(&out);
    fitted?;
    println!(
        "fit, MetaTool's history ({n_turns} turns, 5 folds, {}): {:.1} s wall (the message vectors: {:.1} s, from the cache when it holds them)",
        if lexical_only {
            "lexical only"
        } else {
            "both paths"
        },
        fit_time.as_secs_f64(),
        vectors_time.as_secs_f64(),
    );
    Ok(())
}

fn bench_one(
    label: &str,
    registry: Arc<Registry>,
    messages: &[String],
    rounds: usize,
) -> anyhow::Result<Vec<DecisionRow>> {
    let build_started = Instant::now();
    let router = Router::new(registry.clone(), RouterConfig::default());
    let build_time = build_started.elapsed();
    let settings = loadout_router::replay::every_setting(&registry);
    let session = SessionView::new(1);
    let keywords_by_domain: Vec<Vec<String>> = registry
        .domains()
        .iter()
        .map(|d| d.keywords.clone())
        .collect();
    let n_keywords: usize = keywords_by_domain.iter().map(Vec::len).sum();

    let route = |message: &str| router.select(&RouteInput::new(message, &settings, &session));
    // Round by round in turn, so that a machine slowing down mid-run slows both; the
    // spread is that of the rounds' ratios.
    let mut router_times = Vec::with_capacity(messages.len() * rounds);
    let mut naive_times = Vec::with_capacity(messages.len() * rounds);
    let mut round_speedups = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let ours = time_per_message(messages, 1, |m| {
            black_box(route(m));
        });
        let naive = time_per_message(messages, 1, |m| {
            black_box(naive_route(&keywords_by_domain, m));
        });
        round_speedups.push(
            percentile(&naive, 0.5).as_secs_f64() / percentile(&ours, 0.5).as_secs_f64().max(1e-12),
        );
        router_times.extend(ours);
        naive_times.extend(naive);
    }
    round_speedups.sort_unstable_by(f64::total_cmp);
    let keyword_times = time_per_message(messages, rounds, |m| {
        black_box(router.keyword_domains(m));
    });
    let keyword_p50 = percentile(&keyword_times, 0.5);
    // The decision log's row for each message's selection, reasons written: what the
    // request's thread pays for logging.
    let selections: HashMap<&str, Selection> =
        messages.iter().map(|m| (m.as_str(), route(m))).collect();
    let row_times = time_per_message(messages, rounds, |m| {
        if let Some(selection) = selections.get(m) {
            black_box(loadout_server::decision_log::row(
                selection,
                Some("bench"),
                1,
                m,
                MessageLogging::Plain,
                0,
            ));
        }
    });
    let (router_p50, router_p95) = (
        percentile(&router_times, 0.5),
        percentile(&router_times, 0.95),
    );
    let (naive_p50, naive_p95) = (
        percentile(&naive_times, 0.5),
        percentile(&naive_times, 0.95),
    );
    let speedup = |ours: Duration| naive_p50.as_secs_f64() / ours.as_secs_f64().max(1e-12);
    println!(
        "{label:<34} {:>6} {:>7} {:>9} {:>11} {:>11} {:>11} {:>11} {:>6.1}x {:>12} {:>6.1}x",
        registry.all_tools().len(),
        registry.domains().len(),
        n_keywords,
        micros(router_p50),
        micros(router_p95),
        micros(naive_p50),
        micros(naive_p95),
        speedup(router_p50),
        micros(keyword_p50),
        speedup(keyword_p50),
    );
    println!(
        "{:<34} speedup over {} rounds {:.2}x to {:.2}x; router built in {:.1} ms; decision-log row (reasons written) p50 {} p95 {}",
        "",
        round_speedups.len(),
        round_speedups.first().copied().unwrap_or(0.0),
        round_speedups.last().copied().unwrap_or(0.0),
        build_time.as_secs_f64() * 1e3,
        micros(percentile(&row_times, 0.5)),
        micros(percentile(&row_times, 0.95)),
    );
    Ok(messages
        .iter()
        .filter_map(|m| {
            let selection = selections.get(m.as_str())?;
            Some(loadout_server::decision_log::row(
                selection,
                None,
                1,
                m,
                MessageLogging::Plain,
                0,
            ))
        })
        .collect())
}

/// The dense stage: routing time per message, index build, cold start. `Static`: the
/// table distilled from the built-in encoder, read from (or distilled once into) the
/// xtasks' vector cache; its cold start is not measured again.
fn bench_dense(
    options: &Args,
    registry: Arc<Registry>,
    messages: &[String],
    choice: EmbedderChoice,
) -> anyhow::Result<()> {
    println!("\ndense stage ({choice} encoder, messages embedded outside the router)");
    let cache_root = tempfile_dir("loadout-bench-vectors")?;
    let router = Router::new(registry.clone(), RouterConfig::default());
    let table_dir = match choice {
        EmbedderChoice::Static => crate::eval::default_vector_cache(),
        _ => cache_root.clone(),
    };
    let line = attach_embedder(&router, &choice, Some(&table_dir))?;
    println!("  {line}");
    let model_id = router.dense().map(|d| d.model_id().to_owned());
    let encoder = model_id
        .as_deref()
        .and_then(loadout_embed::encoder_for)
        .context("no encoder installed")?;
    let settings = loadout_router::replay::every_setting(&registry);
    let session = SessionView::new(1);
    let rounds = if options.quick { 1 } else { 3 };
    let select = |m: &str, vectors: &loadout_router::MessageVectors| {
        black_box(router.select(&RouteInput {
            vectors: Some(vectors),
            ..RouteInput::new(m, &settings, &session)
        }));
    };
    let given = encoder
        .vectors_by_message(messages.iter().map(String::as_str))
        .map_err(anyhow::Error::msg)?;
    let empty = loadout_router::MessageVectors::skipped("not embedded");
    let router_only = time_per_message(messages, rounds, |m| {
        select(m, given.get(m).unwrap_or(&empty));
    });
    // The encoder itself, as a message the cache has not seen costs.
    let uncached = time_per_message(messages, rounds, |m| {
        let pieces = loadout_router::message_pieces(m);
        let vectors = encoder.embedder().embed(&pieces).unwrap_or_default();
        let vectors = loadout_router::MessageVectors::new(encoder.model_id(), vectors);
        select(m, &vectors);
    });
    let cached = time_per_message(messages, rounds, |m| {
        select(m, &encoder.message_vectors(m));
    });
    for (label, times) in [
        ("vectors given (router only)", &router_only),
        ("encoder + router, cache miss", &uncached),
        ("encoder + router, cache hit ", &cached),
    ] {
        println!(
            "  routing per dev message, {label}: p50 {}  p95 {}  ({} messages x {rounds})",
            micros(percentile(times, 0.5)),
            micros(percentile(times, 0.95)),
            messages.len()
        );
    }

    // Each catalog's cold start; and its own messages routed, where they are not the
    // dev messages timed above.
    let mut catalogs: Vec<(String, PathBuf, Option<PathBuf>)> = Vec::new();
    if choice == EmbedderChoice::Builtin {
        catalogs.push(("shared catalog".into(), options.catalog.clone(), None));
    }
    if choice == EmbedderChoice::Builtin
        && !options.quick
        && std::path::Path::new(SEAL_CATALOG).is_dir()
    {
        let cases = std::path::Path::new(SEAL_CATALOG).with_file_name("cases.jsonl");
        catalogs.push((
            "Seal-Tools".into(),
            PathBuf::from(SEAL_CATALOG),
            Some(cases),
        ));
    }
    for (label, dir, cases) in catalogs {
        let cache_dir = cache_root.join(label.replace(' ', "-"));
        let _ = std::fs::remove_dir_all(&cache_dir);
        let cold = |cache: &std::path::Path| -> anyhow::Result<(Duration, String, Router)> {
            let started = Instant::now();
            let registry = Registry::builder()
                .toolkit_dir(&dir)
                .with_context(|| format!("loading {}", dir.display()))?
                .build()?;
            let router = Router::new(Arc::new(registry), RouterConfig::default());
            let line = attach_embedder(&router, &EmbedderChoice::Builtin, Some(cache))?;
            Ok((started.elapsed(), line, router))
        };
        let (without_cache, line, _) = cold(&cache_dir)?;
        println!(
            "  {label}: cold start without vector cache {:.2} s ({line})",
            without_cache.as_secs_f64()
        );
        let (with_cache, line, router) = cold(&cache_dir)?;
        println!(
            "  {label}: cold start with vector cache    {:.2} s ({line})",
            with_cache.as_secs_f64()
        );
        // The dense selection on thousands of tools: its own messages, each split
        // into its requests, their vectors computed before timing.
        if let Some(cases) = cases {
            let mut messages = dev_messages(&cases)?;
            messages.truncate(200);
            let given = encoder
                .vectors_by_message(messages.iter().map(String::as_str))
                .map_err(anyhow::Error::msg)?;
            let settings = loadout_router::replay::every_setting(router.registry());
            let times = time_per_message(&messages, rounds, |m| {
                black_box(router.select(&RouteInput {
                    vectors: Some(given.get(m).unwrap_or(&empty)),
                    ..RouteInput::new(m, &settings, &session)
                }));
            });
            println!(
                "  {label}: routing per message, vectors given (router only): p50 {}  p95 {}  ({} messages x {rounds})",
                micros(percentile(&times, 0.5)),
                micros(percentile(&times, 0.95)),
                messages.len()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&cache_root);
    Ok(())
}

/// e5 (the file `LOADOUT_E5_MODEL` names) beside the built-in encoder, in the same
/// run: each dev message and its requests embedded in one call, as the router's
/// encoder asks for them, and the shared catalog's tool texts in the index's batches.
fn bench_e5(
    options: &Args,
    registry: Arc<Registry>,
    messages: &[String],
    model: &std::path::Path,
) -> anyhow::Result<()> {
    println!(
        "
e5 encoder ({}) beside the built-in",
        model.display()
    );
    let e5 = loadout_embed::e5_encoder(model).map_err(anyhow::Error::msg)?;
    let builtin = loadout_embed::shared_builtin().map_err(anyhow::Error::msg)?;
    let rounds = if options.quick { 1 } else { 3 };
    let router = Router::new(registry, RouterConfig::default());
    let texts = router.dense_texts();
    for (label, encoder) in [("built-in", &builtin), ("e5", &e5)] {
        let times = time_per_message(messages, rounds, |m| {
            black_box(encoder.embed(&loadout_router::message_pieces(m)).ok());
        });
        let started = Instant::now();
        loadout_embed::embed_all(encoder.as_ref(), texts, None).map_err(anyhow::Error::msg)?;
        println!(
            "  {label:<8} per dev message: p50 {}  p95 {}  ({} messages x {rounds}); {} tool texts {:.2} s",
            micros(percentile(&times, 0.5)),
            micros(percentile(&times, 0.95)),
            messages.len(),
            texts.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The learned stage's cost: routing each dev message with and without 20,000 learned
/// entries (the dev turns' messages and tools, repeated with a distinct word and, on
/// the dense path, their vectors jittered), lexical-only and with the built-in
/// encoder; and what the entries take in memory.
fn bench_learned(
    options: &Args,
    registry: Arc<Registry>,
    messages: &[String],
) -> anyhow::Result<()> {
    const ENTRIES: usize = 20_000;
    let text = std::fs::read_to_string(&options.cases)
        .with_context(|| format!("reading {}", options.cases.display()))?;
    let cases = loadout_router::replay::cases_from_json_lines(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", options.cases.display()))?;
    let turns = loadout_router::replay::learned_turns(&cases);
    anyhow::ensure!(!turns.is_empty(), "no labeled turns to learn from");
    let settings = loadout_router::replay::every_setting(&registry);
    let session = SessionView::new(1);
    let rounds = if options.quick { 1 } else { 3 };
    println!("\nlearned stage ({ENTRIES} entries, per dev message)");
    let mut paths = vec![("lexical", EmbedderChoice::None)];
    if options.embedder == EmbedderChoice::Builtin {
        paths.push(("dense", EmbedderChoice::Builtin));
    }
    for (path, embedder) in paths {
        let router = Router::new(registry.clone(), RouterConfig::default());
        let cache = tempfile_dir("loadout-bench-learned")?;
        attach_embedder(&router, &embedder, Some(&cache))?;
        let distinct: Vec<String> = turns.iter().map(|turn| turn.message.clone()).collect();
        let encoder = router
            .dense()
            .and_then(|dense| loadout_embed::encoder_for(dense.model_id()));
        let (vectors, model_id) = match &encoder {
            Some(encoder) => {
                let (vectors, _) =
                    loadout_embed::embed_all(encoder.embedder().as_ref(), &distinct, None)
                        .map_err(anyhow::Error::msg)?;
                (Some(vectors), Some(encoder.model_id().to_owned()))
            }
            None => (None, None),
        };
        // The dev messages' own vectors, computed before timing: the learned stage's
        // cost is measured without the encoder's spread.
        let message_vectors = match &encoder {
            Some(encoder) => Some(
                encoder
                    .vectors_by_message(messages.iter().map(String::as_str))
                    .map_err(anyhow::Error::msg)?,
            ),
            None => None,
        };
        let mut rng = Lcg(7);
        let entries: Vec<loadout_router::LearnedEntry> = (0..ENTRIES)
            .map(|i| {
                let j = i % turns.len();
                let turn = &turns[j];
                let vector = vectors.as_ref().map(|v| {
                    v[j].iter()
                        .map(|x| x + (rng.below(1000) as f32 / 1000.0 - 0.5) * 0.02)
                        .collect()
                });
                loadout_router::LearnedEntry {
                    message: format!("{} v{i}", turn.message),
                    tools: turn.tools.clone(),
                    vector,
                    session: turn.session.clone(),
                }
            })
            .collect();
        let built = Instant::now();
        let index = loadout_router::LearnedIndex::new(&router, model_id.as_deref(), &entries);
        let build_time = built.elapsed();
        let time = |learned: Option<&loadout_router::LearnedIndex>| {
            time_per_message(messages, rounds, |m| {
                black_box(router.select(&RouteInput {
                    learned,
                    vectors: message_vectors.as_ref().and_then(|v| v.get(m)),
                    ..RouteInput::new(m, &settings, &session)
                }));
            })
        };
        let without = time(None);
        let with = time(Some(&index));
        let (p50_without, p50_with) = (percentile(&without, 0.5), percentile(&with, 0.5));
        println!(
            "  {path:<8} without p50 {}  p95 {}   with p50 {}  p95 {}   added p50 {}   index {:.1} MB, built in {:.0} ms",
            micros(p50_without),
            micros(percentile(&without, 0.95)),
            micros(p50_with),
            micros(percentile(&with, 0.95)),
            micros(p50_with.saturating_sub(p50_without)),
            index.approx_bytes() as f64 / 1e6,
            build_time.as_secs_f64() * 1000.0
        );
        let _ = std::fs::remove_dir_all(&cache);
    }
    Ok(())
}

fn tempfile_dir(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// The reference design: for every domain, for every keyword, lowercase and search.
fn naive_route(keywords_by_domain: &[Vec<String>], message: &str) -> Vec<usize> {
    let mut matched = Vec::new();
    for (domain_idx, keywords) in keywords_by_domain.iter().enumerate() {
        for keyword in keywords {
            if message.to_lowercase().contains(keyword.as_str()) {
                matched.push(domain_idx);
            }
        }
    }
    matched
}

/// One sample per message per round, after a warm-up round.
fn time_per_message(
    messages: &[String],
    rounds: usize,
    mut route: impl FnMut(&str),
) -> Vec<Duration> {
    for message in messages {
        route(message);
    }
    let mut samples = Vec::with_capacity(messages.len() * rounds);
    for _ in 0..rounds {
        for message in messages {
            let started = Instant::now();
            route(message);
            samples.push(started.elapsed());
        }
    }
    samples
}

fn percentile(samples: &[Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn micros(d: Duration) -> String {
    format!("{:.1} us", d.as_secs_f64() * 1e6)
}

fn dev_messages(cases: &PathBuf) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(cases).with_context(|| format!("reading {}", cases.display()))?;
    let mut messages = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line)?;
        for turn in case["turns"].as_array().into_iter().flatten() {
            if let Some(user) = turn["user"].as_str() {
                messages.push(user.to_owned());
            }
        }
    }
    Ok(messages)
}

/// Deterministic pseudo-random numbers (a 64-bit LCG): the same catalog every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Pronounceable made-up words: distinct enough to index, none of them English.
fn word(rng: &mut Lcg) -> String {
    const SYLLABLES: &[&str] = &[
        "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qui", "dor", "fen", "gal",
        "hum", "jor", "bex", "cyn",
    ];
    let n = 2 + rng.below(3);
    (0..n)
        .map(|_| SYLLABLES[rng.below(SYLLABLES.len())])
        .collect()
}

fn synthetic_registry(
    n_domains: usize,
    tools_per_domain: usize,
    keywords_per_domain: usize,
) -> anyhow::Result<Registry> {
    let mut rng = Lcg(0x5eed);
    let mut builder = Registry::builder();
    for d in 0..n_domains {
        let domain = format!("domain_{d:02}");
        let keywords: Vec<String> = (0..keywords_per_domain)
            .map(|k| {
                if k % 5 == 4 {
                    format!("{} {}", word(&mut rng), word(&mut rng))
                } else {
                    word(&mut rng)
                }
            })
            .collect();
        let tools: Vec<serde_json::Value> = (0..tools_per_domain)
            .map(|t| {
                let description: Vec<String> = (0..14).map(|_| word(&mut rng)).collect();
                serde_json::json!({
                    "name": format!("{domain}_tool_{t:02}"),
                    "description": format!("{}.", description.join(" ")),
                    "input_schema": {"type": "object", "properties": {
                        "target": {"type": "string", "description": "What to act on."},
                        "limit": {"type": "integer", "description": "Most results.", "minimum": 1}
                    }, "required": ["target"]}
                })
            })
            .collect();
        let file = serde_json::json!({
            "domain": domain,
            "description": format!("Synthetic domain {d} for the router benchmark."),
            "keywords": keywords,
            "settings_keys": [],
            "tools": tools,
        });
        let toolkit =
            loadout::toolkit::parse(&file.to_string(), &format!("synthetic/{domain}.json"))?;
        builder = builder.toolkit(toolkit);
    }
    Ok(builder.build()?)
}

/// Messages of 6-20 words like real chat: mostly English filler, with one to three
/// made-up words from the catalog's generator (so some are keywords or description
/// terms).
fn synthetic_messages(n: usize) -> Vec<String> {
    const FILLER: &[&str] = &[
        "can", "you", "please", "check", "the", "my", "what", "is", "going", "on", "with", "show",
        "me", "all", "turn", "off", "and", "then", "tell", "how", "much", "today", "again",
        "there", "any", "new", "for",
    ];
    let mut rng = Lcg(0xfeed);
    (0..n)
        .map(|_| {
            let n_words = 6 + rng.below(15);
            let n_catalog_words = 1 + rng.below(3);
            let mut words: Vec<String> = (0..n_words)
                .map(|_| FILLER[rng.below(FILLER.len())].to_owned())
                .collect();
            for _ in 0..n_catalog_words {
                let at = rng.below(words.len());
                words[at] = word(&mut rng);
            }
            words.join(" ")
        })
        .collect()
}
