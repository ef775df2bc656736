//! `cargo xtask eval`: replays labeled conversations through the router, turn by turn,
//! and reports recall, tools and tokens sent, and every miss with the router's reasons.
//!
//! The session is fed exactly as the server feeds it: the same [`SessionView`] updates
//! (`begin_turn`, `record_calls`), kept in memory instead of the store.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use loadout::Registry;
use loadout_router::replay::{
    Case, Comparison, Report, cases_from_json_lines, folds, learned_turns, replay,
};
use loadout_router::{LearnedEntry, LearnedIndex, MessageVectors, Router, RouterConfig};

const USAGE: &str = "usage: cargo xtask eval --catalog DIR --cases FILE [--json] [--verbose]
       [--min-turn-recall X] [--config ROUTER_CONFIG.json] [--budget TOKENS]
       [--embedder builtin|none|URL#MODEL] [--vector-cache DIR|none] [--tool-ranks]
       [--compare CANDIDATE.json] [--history FILE | --folds K]
  --embedder      the dense stage: the built-in encoder (default when built with the
                  `dense` feature), none (lexical only), or an OpenAI-compatible
                  embeddings endpoint and its model, as the server's
                  `embeddings_base_url` and `embeddings_model` settings name them
                  (e.g. http://127.0.0.1:11434/v1#nomic-embed-text); its bearer key,
                  if it needs one, from LOADOUT_EMBEDDINGS_API_KEY
  --vector-cache  where tool vectors are cached (default target/vector-cache)
  --tool-ranks    also report how often every needed tool of a turn is among the k
                  best of the message-only tool ranking (`search_tools`)
  --compare       also replay with this router config and list the turns it breaks
                  (now missed) and fixes (now hit) against --config (or defaults)
  --weights       route with this scorer weights file (`cargo xtask fit --out`)
                  instead of the shipped router/weights.json
  --history       learn from this file's labeled turns (the eval format; never the
                  cases themselves), then route the cases; prints the figures without
                  and with what was learned, and fails if learning lowers turn recall
  --folds         learn from the cases themselves, K folds by conversation: each
                  fold is routed with what the other folds teach";

struct Options {
    catalog: PathBuf,
    cases: PathBuf,
    json: bool,
    verbose: bool,
    tool_ranks: bool,
    min_turn_recall: Option<f64>,
    config: RouterConfig,
    compare: Option<RouterConfig>,
    budget: Option<usize>,
    embedder: EmbedderChoice,
    vector_cache: Option<PathBuf>,
    learning: Learning,
    /// Scorer weights to route with instead of the shipped ones.
    weights: Option<PathBuf>,
}

/// Where the learned stage's past messages come from.
#[derive(Debug, Clone, PartialEq)]
enum Learning {
    None,
    History(PathBuf),
    Folds(usize),
}

/// Which dense stage `eval` and `bench` run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbedderChoice {
    None,
    Builtin,
    /// An OpenAI-compatible `/v1/embeddings` endpoint: the server's second embedder,
    /// so a model can be measured on the eval before a deployment points at it.
    Endpoint {
        base_url: String,
        model: String,
    },
}

impl EmbedderChoice {
    pub fn default_for_build() -> EmbedderChoice {
        if loadout_embed::builtin_available() {
            EmbedderChoice::Builtin
        } else {
            EmbedderChoice::None
        }
    }

    pub fn parse(text: &str) -> anyhow::Result<EmbedderChoice> {
        match text {
            "none" | "lexical" => Ok(EmbedderChoice::None),
            "builtin" => Ok(EmbedderChoice::Builtin),
            other => match other.split_once('#') {
                Some((base_url, model))
                    if (base_url.starts_with("http://") || base_url.starts_with("https://"))
                        && !model.trim().is_empty() =>
                {
                    Ok(EmbedderChoice::Endpoint {
                        base_url: base_url.to_owned(),
                        model: model.trim().to_owned(),
                    })
                }
                _ => bail!(
                    "--embedder {other}: expected builtin, none or an endpoint URL#MODEL \
                     (e.g. http://127.0.0.1:11434/v1#nomic-embed-text)"
                ),
            },
        }
    }

    pub fn name(&self) -> String {
        match self {
            EmbedderChoice::None => "none (lexical only)".to_owned(),
            EmbedderChoice::Builtin => "builtin".to_owned(),
            EmbedderChoice::Endpoint { base_url, model } => format!("{base_url}#{model}"),
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

/// Every user message of `cases` embedded for `router`'s dense stage (all at once,
/// through its encoder's queue and cache), as the server does per message; `None`
/// without a dense stage.
pub fn case_vectors(
    router: &Router,
    cases: &[Case],
) -> anyhow::Result<Option<HashMap<String, MessageVectors>>> {
    let Some(dense) = router.dense() else {
        return Ok(None);
    };
    let encoder = loadout_embed::encoder_for(dense.model_id())
        .ok_or_else(|| anyhow::anyhow!("no encoder installed for {}", dense.model_id()))?;
    let messages = cases
        .iter()
        .flat_map(|case| case.turns.iter().map(|turn| turn.user.as_str()));
    Ok(Some(
        encoder
            .vectors_by_message(messages)
            .map_err(anyhow::Error::msg)?,
    ))
}

/// Attaches the chosen dense stage to `router`, synchronously. Returns a line for the
/// report.
pub fn attach_embedder(
    router: &Router,
    choice: &EmbedderChoice,
    vector_cache: Option<&std::path::Path>,
) -> anyhow::Result<String> {
    let started = Instant::now();
    let embedder: Arc<dyn loadout_embed::Embedder> = match choice {
        EmbedderChoice::None => return Ok("embedder none (lexical only)".to_owned()),
        EmbedderChoice::Builtin => loadout_embed::shared_builtin().map_err(anyhow::Error::msg)?,
        EmbedderChoice::Endpoint { base_url, model } => {
            let api_key = std::env::var("LOADOUT_EMBEDDINGS_API_KEY").ok();
            Arc::new(
                loadout_embed::http::HttpEmbedder::new(base_url, model, api_key)
                    .map_err(anyhow::Error::msg)?,
            )
        }
    };
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut cache =
        vector_cache.map(|dir| loadout_embed::VectorCache::open(dir, embedder.model_id()));
    let (index, stats) = loadout_embed::build_dense_index(router, embedder.clone(), cache.as_mut())
        .map_err(anyhow::Error::msg)?;
    // Messages are embedded outside the router, by the model's shared encoder.
    loadout_embed::install_encoder(embedder).map_err(anyhow::Error::msg)?;
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

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut catalog = None;
    let mut cases = None;
    let mut json = false;
    let mut verbose = false;
    let mut tool_ranks = false;
    let mut min_turn_recall = None;
    let mut config = eval_config();
    let mut weights = None;
    let mut compare = None;
    let mut budget = None;
    let mut embedder = EmbedderChoice::default_for_build();
    let mut vector_cache = Some(default_vector_cache());
    let mut learning = Learning::None;
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
            "--config" => config = read_config(&value("--config")?)?,
            "--weights" => weights = Some(PathBuf::from(value("--weights")?)),
            "--history" => learning = Learning::History(PathBuf::from(value("--history")?)),
            "--folds" => {
                let text = value("--folds")?;
                match text.parse::<usize>() {
                    Ok(k) if k >= 2 => learning = Learning::Folds(k),
                    _ => bail!("--folds {text}: expected a number of folds, 2 or more"),
                }
            }
            "--compare" => compare = Some(read_config(&value("--compare")?)?),
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
        compare,
        budget,
        embedder,
        vector_cache,
        learning,
        weights,
    })
}

/// The router config of the eval (and the fit): the shared catalog's scratchpad
/// stands for the linked domain, whose `create_table` pins it
/// (`#[tool(pins_domain = true)]`); a toolkit file cannot say so. Other catalogs have
/// no such tool, and nothing changes for them.
pub fn eval_config() -> RouterConfig {
    RouterConfig {
        pin_on_tools: vec!["create_table".into()],
        ..RouterConfig::default()
    }
}

fn read_config(path: &str) -> anyhow::Result<RouterConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let config: RouterConfig =
        serde_json::from_str(&text).with_context(|| format!("parsing {path}"))?;
    let problems = config.problems();
    if !problems.is_empty() {
        bail!("{path}: {}", problems.join("; "));
    }
    Ok(config)
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
    let mut router = Router::new(registry.clone(), options.config.clone());
    if let Some(path) = &options.weights {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let weights = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a weights file", path.display()))?;
        router.set_weights(weights);
    }
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let embedder_line =
        attach_embedder(&router, &options.embedder, options.vector_cache.as_deref())?;

    let cases_text = std::fs::read_to_string(&options.cases)
        .with_context(|| format!("reading {}", options.cases.display()))?;
    let cases = cases_from_json_lines(&cases_text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", options.cases.display()))?;

    // Per turn with needed tools: the worst rank of a needed tool in the message-only
    // tool ranking (`search_tools`), `usize::MAX` when one is not ranked at all.
    let mut worst_ranks: Vec<usize> = Vec::new();
    // Turns whose message is written in Hangul, and how many of them hit: reported
    // on their own line, since the built-in encoder is English-only.
    let (mut korean_turns, mut korean_hits) = (0usize, 0usize);
    let embedding = Instant::now();
    let vectors = case_vectors(&router, &cases)?;
    let embed_ms = embedding.elapsed().as_secs_f64() * 1e3;
    let report = replay(
        &router,
        &cases,
        options.budget,
        None,
        vectors.as_ref(),
        |routed| {
            let turn = &routed.case.turns[routed.turn_idx];
            if turn.user.chars().any(is_hangul) {
                korean_turns += 1;
                korean_hits +=
                    usize::from(turn.needed.iter().all(|t| routed.selection.contains(t)));
            }
            if options.tool_ranks && !turn.needed.is_empty() {
                let query = vectors.as_ref().and_then(|v| v.get(&turn.user));
                let ranking =
                    router.search(&turn.user, Some(routed.settings), None, query, usize::MAX);
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
            print_verbose(&options, "", routed);
        },
    )
    .map_err(anyhow::Error::msg)?;

    println!(
        "eval {} on {} ({} domains, {} tools; router built in {build_ms:.0} ms)",
        options.cases.display(),
        options.catalog.display(),
        registry.domains().len(),
        registry.all_tools().len()
    );
    println!("{embedder_line}");
    if let Some(vectors) = &vectors {
        // Route times below are the router's alone: the messages were embedded here.
        println!(
            "messages embedded beforehand: {} distinct in {embed_ms:.0} ms",
            vectors.len()
        );
    }
    for line in report.miss_lines() {
        println!("{line}");
    }
    println!("{}", report.summary_line());
    if korean_turns > 0 {
        println!(
            "korean (Hangul messages): turns {korean_turns}  turn_recall {:.3}",
            korean_hits as f64 / korean_turns as f64
        );
    }
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
    if let Some(candidate) = &options.compare {
        let tried = Router::new(registry.clone(), candidate.clone());
        attach_embedder(&tried, &options.embedder, options.vector_cache.as_deref())?;
        let tried_vectors = case_vectors(&tried, &cases)?;
        let tried = replay(
            &tried,
            &cases,
            options.budget,
            None,
            tried_vectors.as_ref(),
            |_| {},
        )
        .map_err(anyhow::Error::msg)?;
        let comparison = Comparison::new(&report, &tried);
        for line in comparison.lines() {
            println!("{line}");
        }
        println!("candidate  {}", tried.summary_line());
        println!(
            "{} turns now missed, {} now hit",
            comparison.now_missed.len(),
            comparison.now_hit.len()
        );
    }
    let learned = learned_report(&router, &cases, &options)?;
    if let Some((with, line)) = &learned {
        println!("{line}");
        println!("without history  {}", report.summary_line());
        println!("with history     {}", with.summary_line());
        for miss in Comparison::new(&report, with).now_missed {
            println!(
                "LEARNING BROKE {} turn {}: {:?}\n  missing: {}\n  {}",
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
    }
    let gated = learned.as_ref().map_or(&report, |(with, _)| with);
    let turn_recall = gated.turn_recall();
    if options.json {
        let mut summary = gated.to_json();
        if learned.is_some() {
            summary["without_history"] = report.to_json();
        }
        summary["cases"] = options.cases.display().to_string().into();
        summary["catalog"] = options.catalog.display().to_string().into();
        summary["embedder"] = options.embedder.name().into();
        println!("{summary}");
    }
    if let Some(min) = options.min_turn_recall
        && turn_recall < min
    {
        bail!("turn recall {turn_recall:.3} is below the gate {min:.3}");
    }
    if let Some((with, _)) = &learned
        && with.turn_recall() < report.turn_recall()
    {
        bail!(
            "learning lowered turn recall: {:.3} with history, {:.3} without",
            with.turn_recall(),
            report.turn_recall()
        );
    }
    Ok(())
}

fn is_hangul(c: char) -> bool {
    matches!(c, '\u{AC00}'..='\u{D7A3}' | '\u{1100}'..='\u{11FF}' | '\u{3130}'..='\u{318F}')
}

/// With `--verbose`, one turn's message and selection.
fn print_verbose(options: &Options, label: &str, routed: &loadout_router::replay::Routed<'_>) {
    if options.verbose {
        let turn = &routed.case.turns[routed.turn_idx];
        println!(
            "{label}{}{} #{} {:?} needed {:?}\n    {}",
            if label.is_empty() { "" } else { " " },
            routed.case.id,
            routed.turn_idx + 1,
            turn.user,
            turn.needed,
            routed.selection.summary_line()
        );
    }
}

/// The cases routed with what `--history` or `--folds` teach, and a line on what was
/// learned; `None` without either.
fn learned_report(
    router: &Router,
    cases: &[Case],
    options: &Options,
) -> anyhow::Result<Option<(Report, String)>> {
    let started = Instant::now();
    match &options.learning {
        Learning::None => Ok(None),
        Learning::History(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let history = cases_from_json_lines(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let overlap = cases
                .iter()
                .filter(|c| history.iter().any(|h| h.id == c.id))
                .count();
            if overlap > 0 {
                bail!(
                    "{}: {overlap} cases are also in the history",
                    path.display()
                );
            }
            let index = learned_index(router, &learned_turns(&history), options)?;
            let vectors = case_vectors(router, cases)?;
            let report = replay(
                router,
                cases,
                options.budget,
                Some(&index),
                vectors.as_ref(),
                |routed| print_verbose(options, "with history", routed),
            )
            .map_err(anyhow::Error::msg)?;
            let line = format!(
                "learned {} past turns ({} with vectors, about {} KB) from {} in {:.1} s",
                index.len(),
                index.n_vectors(),
                index.approx_bytes() / 1024,
                path.display(),
                started.elapsed().as_secs_f64()
            );
            Ok(Some((report, line)))
        }
        Learning::Folds(k) => {
            let folds = folds(cases, *k);
            let mut total = Report::default();
            let mut n_learned = 0;
            for (f, fold) in folds.iter().enumerate() {
                let others = loadout_router::replay::all_but(&folds, f);
                let index = learned_index(router, &learned_turns(&others), options)?;
                n_learned += index.len();
                let vectors = case_vectors(router, fold)?;
                let report = replay(
                    router,
                    fold,
                    options.budget,
                    Some(&index),
                    vectors.as_ref(),
                    |routed| print_verbose(options, "with history", routed),
                )
                .map_err(anyhow::Error::msg)?;
                total.absorb(report);
            }
            let line = format!(
                "learned in {k} folds by conversation: each fold from the other {} ({} past turns a fold on average) in {:.1} s",
                k - 1,
                n_learned / k,
                started.elapsed().as_secs_f64()
            );
            Ok(Some((total, line)))
        }
    }
}

/// Past turns indexed for `router`, with the dense stage's vectors when it runs
/// (cached beside the tool vectors, under `learned/`).
fn learned_index(
    router: &Router,
    turns: &[(String, Vec<String>)],
    options: &Options,
) -> anyhow::Result<LearnedIndex> {
    let messages: Vec<String> = turns.iter().map(|(message, _)| message.clone()).collect();
    let (vectors, model_id) = match router.dense() {
        Some(dense) => {
            let encoder = loadout_embed::encoder_for(dense.model_id())
                .ok_or_else(|| anyhow::anyhow!("no encoder installed for {}", dense.model_id()))?;
            let embedder = encoder.embedder();
            let mut cache = options.vector_cache.as_ref().map(|dir| {
                loadout_embed::VectorCache::open(&dir.join("learned"), embedder.model_id())
            });
            let (vectors, _) =
                loadout_embed::embed_all(embedder.as_ref(), &messages, cache.as_mut())
                    .map_err(anyhow::Error::msg)?;
            if let Some(cache) = &mut cache {
                cache
                    .save()
                    .with_context(|| format!("writing {}", cache.path().display()))?;
            }
            (
                vectors.into_iter().map(Some).collect(),
                Some(dense.model_id().to_owned()),
            )
        }
        None => (vec![None; turns.len()], None),
    };
    let entries: Vec<LearnedEntry> = turns
        .iter()
        .zip(vectors)
        .map(|((message, tools), vector)| LearnedEntry {
            message: message.clone(),
            tools: tools.clone(),
            vector,
        })
        .collect();
    Ok(LearnedIndex::new(router, model_id.as_deref(), &entries))
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};

    use super::*;

    #[test]
    fn an_embedder_is_builtin_none_or_an_endpoint_with_its_model() {
        assert_eq!(
            EmbedderChoice::parse("http://127.0.0.1:11434/v1#nomic-embed-text").ok(),
            Some(EmbedderChoice::Endpoint {
                base_url: "http://127.0.0.1:11434/v1".into(),
                model: "nomic-embed-text".into()
            })
        );
        assert_eq!(
            EmbedderChoice::parse("none").ok(),
            Some(EmbedderChoice::None)
        );
        for bad in [
            "bert",
            "http://127.0.0.1:1/v1",
            "http://127.0.0.1:1/v1#",
            "ftp://x#m",
        ] {
            let error = EmbedderChoice::parse(bad).err().map(|e| e.to_string());
            assert!(
                error.as_deref().is_some_and(|e| e.contains("URL#MODEL")),
                "{bad}: {error:?}"
            );
        }
    }

    /// One `/v1/embeddings` answer per connection from a plain thread: the vector of a
    /// text is [its length, its count of 'e'], so tools get distinct vectors.
    fn serve_embeddings(connections: usize) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            for stream in listener.incoming().take(connections) {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut length = 0;
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = value.trim().parse().expect("length");
                    }
                    line.clear();
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).expect("body");
                let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
                let data: Vec<serde_json::Value> = body["input"]
                    .as_array()
                    .expect("input")
                    .iter()
                    .enumerate()
                    .map(|(i, text)| {
                        let text = text.as_str().expect("text");
                        let vector = [text.len() as f32, text.matches('e').count() as f32];
                        serde_json::json!({"index": i, "embedding": vector})
                    })
                    .collect();
                let answer = serde_json::json!({"data": data}).to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            }
        });
        format!("http://{addr}/v1")
    }

    #[test]
    fn an_endpoint_embeds_the_tools_and_a_dead_one_is_a_clear_error() {
        let registry = Arc::new(loadout_domains::registry().expect("registry builds"));
        let router = Router::new(registry.clone(), RouterConfig::default());
        let base = serve_embeddings(64);
        let choice = EmbedderChoice::parse(&format!("{base}#toy")).expect("parses");
        let line = attach_embedder(&router, &choice, None).expect("attaches");
        assert!(
            line.contains(&format!("openai-compatible:{base}#toy")),
            "{line}"
        );
        assert!(!line.contains(" 0 embedded"), "{line}");

        let dead = EmbedderChoice::parse("http://127.0.0.1:9/v1#toy").expect("parses");
        let error = attach_embedder(&Router::new(registry, RouterConfig::default()), &dead, None)
            .err()
            .map(|e| e.to_string());
        assert!(
            error.as_deref().is_some_and(|e| e.contains("unreachable")),
            "{error:?}"
        );
    }
}
