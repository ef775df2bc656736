//! The `core` domain: tools about Loadout itself (domains, tools, settings) and the
//! few utilities every conversation may need (the time, arithmetic).
//!
//! It is sent on every turn, so its tools stay few and their descriptions short.
//! It depends on `loadout` only and must not depend on any other domain crate.
//!
//! The router's meta-tools (`search_tools`, `load_tools`, `unload_tools`,
//! `load_all_for_this_turn`) are core tools too: they tell the model how to reach tools
//! that were not sent. They act through [`loadout::SessionControl`], which the server
//! running the conversation attaches to the call's context; without one (CLI) they
//! answer that every tool is already available. The MCP server answers `search_tools`
//! itself and serves none of the others (its tool list is constant).

mod expression;

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use loadout::{SessionControl, ToolContext, ToolError, is_secret_key, mask_secret};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use expression::{ExpressionError, MAX_DEPTH, MAX_INPUT_LEN, evaluate};

loadout::domain! {
    name: "core",
    description: "Loadout itself: which domains and tools exist and whether they are active, reading and changing settings (API keys, folders), plus the current time in any timezone and a safe calculator.",
    keywords: [
        "loadout", "tools", "domains", "settings", "configure", "api key",
        "time", "date", "timezone", "clock", "calculate", "math", "arithmetic",
        "설정", "시간", "날짜", "계산",
    ],
    always_on: true,
}

/// Referenced by the `loadout-domains` hub so the linker keeps this crate.
pub fn link() {}

// ---------------------------------------------------------------------------
// Domains and tools

/// One domain as `list_domains` reports it.
#[derive(Debug, Serialize)]
pub struct DomainStatus {
    pub name: String,
    pub description: String,
    /// All required settings have values.
    pub active: bool,
    /// Sent on every turn, whatever the message.
    pub always_on: bool,
    /// Settings keys the domain needs that have no value yet.
    pub missing_settings: Vec<String>,
    /// Where the missing keys are set: `set_setting` for some, the operator for others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub how_to_configure: Option<String>,
    pub n_tools: usize,
}

/// Lists every domain with whether it is active, which settings it still needs, and how many tools it has.
///
/// Use it to see what Loadout can do and what must be configured first: a domain
/// with `missing_settings` becomes active once those keys are set, where
/// `how_to_configure` says.
#[loadout::tool(
    domain = "core",
    keywords = ["domains", "capabilities", "what can you do", "active", "도메인"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn list_domains(ctx: &ToolContext) -> Result<Vec<DomainStatus>, ToolError> {
    let settings = ctx.settings().snapshot().await?;
    let registry = ctx.registry();
    Ok(registry
        .domains()
        .iter()
        .map(|domain| {
            let missing_settings = registry.missing_settings(&domain.name, &settings);
            DomainStatus {
                name: domain.name.clone(),
                description: domain.description.clone(),
                active: missing_settings.is_empty(),
                always_on: domain.always_on,
                how_to_configure: (!missing_settings.is_empty())
                    .then(|| loadout::where_to_set(&missing_settings)),
                missing_settings,
                n_tools: domain.tools.len(),
            }
        })
        .collect())
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListToolsArgs {
    /// Only tools of this domain (see `list_domains`); all tools when omitted.
    #[serde(default)]
    pub domain: Option<String>,
}

/// One tool as `list_tools` reports it.
#[derive(Debug, Serialize)]
pub struct ToolSummary {
    pub name: String,
    pub domain: String,
    /// The first sentence of the tool's description.
    pub hint: String,
}

/// Lists tools by name with their domain and a one-sentence hint, optionally for one domain.
///
/// Use it to find the exact name of a tool; the full description and parameters
/// come with the tool itself once it is loaded.
#[loadout::tool(
    domain = "core",
    keywords = ["tools", "functions", "commands", "list", "도구"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub fn list_tools(args: ListToolsArgs, ctx: &ToolContext) -> Result<Vec<ToolSummary>, ToolError> {
    let registry = ctx.registry();
    if let Some(domain) = &args.domain
        && registry.domain(domain).is_none()
    {
        let known: Vec<&str> = registry.domains().iter().map(|d| d.name.as_str()).collect();
        return Err(ToolError::execution(format!(
            "unknown domain `{domain}`; known domains: {}",
            known.join(", ")
        )));
    }
    Ok(registry
        .all_tools()
        .iter()
        .filter(|tool| args.domain.as_ref().is_none_or(|d| *d == tool.domain))
        .map(|tool| ToolSummary {
            name: tool.name.clone(),
            domain: tool.domain.clone(),
            hint: tool.hint.clone(),
        })
        .collect())
}

// ---------------------------------------------------------------------------
// Meta-tools: reaching tools that were not sent

/// Default and largest number of `search_tools` results.
pub const DEFAULT_SEARCH_LIMIT: u32 = 10;
pub const MAX_SEARCH_LIMIT: u32 = 50;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchToolsArgs {
    /// What you want to do, in a few words (e.g. "read a file", "remember a fact").
    #[schemars(length(min = 1))]
    pub query: String,
    /// Most results to return (default 10).
    #[serde(default)]
    #[schemars(range(min = 1, max = 50))]
    pub limit: Option<u32>,
}

/// Finds tools that were not sent to you, by what they do; returns names, domains and one-line hints.
#[loadout::tool(
    domain = "core",
    keywords = ["find tool", "search tools", "which tool", "도구 검색"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn search_tools(
    args: SearchToolsArgs,
    ctx: &ToolContext,
) -> Result<serde_json::Value, ToolError> {
    let query = args.query.trim();
    if query.is_empty() {
        return Err(ToolError::InvalidArgs {
            field: Some("query".into()),
            message: "must not be empty".into(),
        });
    }
    let limit = args
        .limit
        .unwrap_or(DEFAULT_SEARCH_LIMIT)
        .clamp(1, MAX_SEARCH_LIMIT) as usize;
    let control = control(ctx, "search_tools")?;
    control
        .search(query, limit)
        .await
        .map_err(ToolError::Execution)
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolNamesArgs {
    /// Tool or domain names, as `search_tools` or the hints give them.
    #[schemars(length(min = 1))]
    pub names: Vec<String>,
}

/// Loads tools that were not sent to you, by tool or domain name; they can be called right after.
#[loadout::tool(
    domain = "core",
    keywords = ["load tool", "enable tool"],
    read_only = false,
    destructive = false,
    idempotent = true,
    open_world = false
)]
pub async fn load_tools(
    args: ToolNamesArgs,
    ctx: &ToolContext,
) -> Result<serde_json::Value, ToolError> {
    let names = checked_names(args.names)?;
    let control = control(ctx, "load_tools")?;
    control.load(&names).await.map_err(ToolError::Execution)
}

/// Unloads tools or domains you no longer need, to keep your tool list short; core tools stay.
#[loadout::tool(
    domain = "core",
    keywords = ["unload tool"],
    read_only = false,
    destructive = false,
    idempotent = true,
    open_world = false
)]
pub async fn unload_tools(
    args: ToolNamesArgs,
    ctx: &ToolContext,
) -> Result<serde_json::Value, ToolError> {
    let names = checked_names(args.names)?;
    let control = control(ctx, "unload_tools")?;
    control.unload(&names).await.map_err(ToolError::Execution)
}

/// Sends you every active tool until the user's next message; use it only when `search_tools` finds nothing that fits.
#[loadout::tool(
    domain = "core",
    keywords = ["all tools"],
    read_only = false,
    destructive = false,
    idempotent = true,
    open_world = false
)]
pub async fn load_all_for_this_turn(ctx: &ToolContext) -> Result<serde_json::Value, ToolError> {
    let control = control(ctx, "load_all_for_this_turn")?;
    control
        .load_all_for_this_turn()
        .await
        .map_err(ToolError::Execution)
}

fn control(ctx: &ToolContext, tool: &str) -> Result<Arc<dyn SessionControl>, ToolError> {
    ctx.session_control().cloned().ok_or_else(|| {
        ToolError::execution(format!(
            "`{tool}` works in a routed chat session; here every tool is already available"
        ))
    })
}

/// Trimmed, non-empty names; at most 64 of them.
fn checked_names(names: Vec<String>) -> Result<Vec<String>, ToolError> {
    const MAX_NAMES: usize = 64;
    if names.len() > MAX_NAMES {
        return Err(ToolError::InvalidArgs {
            field: Some("names".into()),
            message: format!("at most {MAX_NAMES} names per call"),
        });
    }
    let names: Vec<String> = names
        .into_iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        return Err(ToolError::InvalidArgs {
            field: Some("names".into()),
            message: "must name at least one tool or domain".into(),
        });
    }
    Ok(names)
}

// ---------------------------------------------------------------------------
// Settings

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetSettingArgs {
    /// The setting's key, e.g. `filesystem_roots`.
    pub key: String,
}

/// A setting as read back; secret values are masked.
#[derive(Debug, Serialize)]
pub struct SettingValue {
    pub key: String,
    /// The value, masked when the key looks secret; `null` when unset.
    pub value: Option<String>,
    pub is_set: bool,
    pub masked: bool,
    /// Domains that need this key to be active.
    pub needed_by: Vec<String>,
}

/// Reads one setting; values of secret-looking keys (API keys, tokens, passwords) are masked.
#[loadout::tool(
    domain = "core",
    keywords = ["setting", "config", "value", "설정"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn get_setting(
    args: GetSettingArgs,
    ctx: &ToolContext,
) -> Result<SettingValue, ToolError> {
    check_key(&args.key)?;
    let value = ctx.settings().get(&args.key).await?;
    Ok(setting_value(ctx, &args.key, value.as_deref()))
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetSettingArgs {
    /// The setting's key: lowercase letters, digits and `_`, e.g. `llm_api_key`.
    pub key: String,
    /// The new value. An empty string removes the setting.
    pub value: String,
}

/// What `set_setting` did.
#[derive(Debug, Serialize)]
pub struct SetSettingResult {
    pub key: String,
    /// The stored value, masked when the key looks secret; `null` when removed.
    pub value: Option<String>,
    pub removed: bool,
    /// Domains that need this key, with whether they are active now.
    pub domains: Vec<DomainActivation>,
}

#[derive(Debug, Serialize)]
pub struct DomainActivation {
    pub domain: String,
    pub active: bool,
    pub missing_settings: Vec<String>,
}

/// Stores a setting (for example an API key the user gave you); an empty value removes it.
///
/// Keys that change what tools can reach or where data goes (`filesystem_roots`, URLs,
/// `decision_log`) are the operator's: ask the user to set those. The change applies at once: domains whose required settings are now all set become
/// active, and the response says which. Secret values are never echoed back in full.
#[loadout::tool(
    domain = "core",
    keywords = ["setting", "configure", "api key", "enable", "설정"],
    read_only = false,
    destructive = false,
    idempotent = true,
    open_world = false
)]
pub async fn set_setting(
    args: SetSettingArgs,
    ctx: &ToolContext,
) -> Result<SetSettingResult, ToolError> {
    check_key(&args.key)?;
    let removed = args.value.trim().is_empty();
    // The model sets credentials and names; keys that widen what tools reach or
    // change where data goes are the operator's, and every value is checked here,
    // so the answer names what is wrong instead of a later call failing.
    loadout::check_setting(
        &args.key,
        (!removed).then_some(args.value.as_str()),
        loadout::Setter::Model,
    )
    .map_err(ToolError::execution)?;
    if removed {
        ctx.settings().unset(&args.key).await?;
    } else {
        ctx.settings().set(&args.key, &args.value).await?;
    }
    let settings = ctx.settings().snapshot().await?;
    let registry = ctx.registry();
    let domains = registry
        .domains()
        .iter()
        .filter(|d| d.settings_keys.contains(&args.key))
        .map(|d| {
            let missing_settings = registry.missing_settings(&d.name, &settings);
            DomainActivation {
                domain: d.name.clone(),
                active: missing_settings.is_empty(),
                missing_settings,
            }
        })
        .collect();
    Ok(SetSettingResult {
        value: (!removed).then(|| shown_value(&args.key, &args.value)),
        key: args.key,
        removed,
        domains,
    })
}

/// All settings as `list_settings` reports them.
#[derive(Debug, Serialize)]
pub struct SettingsList {
    pub settings: Vec<SettingValue>,
    /// Keys some domain needs that have no value yet, with the domains needing them.
    pub unset_required: BTreeMap<String, Vec<String>>,
}

/// Lists every stored setting (secret values masked) and the keys domains still need.
#[loadout::tool(
    domain = "core",
    keywords = ["settings", "config", "configuration", "설정"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn list_settings(ctx: &ToolContext) -> Result<SettingsList, ToolError> {
    let snapshot = ctx.settings().snapshot().await?;
    let settings = snapshot
        .iter()
        .map(|(key, value)| setting_value(ctx, key, Some(value)))
        .collect();
    let mut unset_required: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for domain in ctx.registry().domains() {
        for key in ctx.registry().missing_settings(&domain.name, &snapshot) {
            unset_required
                .entry(key)
                .or_default()
                .push(domain.name.clone());
        }
    }
    Ok(SettingsList {
        settings,
        unset_required,
    })
}

fn check_key(key: &str) -> Result<(), ToolError> {
    loadout::validate_setting_key(key).map_err(|_| {
        ToolError::execution(format!(
            "invalid setting key `{}`: use 1-128 lowercase letters, digits and `_`, e.g. `filesystem_roots`",
            key.chars().take(128).collect::<String>()
        ))
    })
}

fn shown_value(key: &str, value: &str) -> String {
    if is_secret_key(key) {
        mask_secret(value)
    } else {
        value.to_owned()
    }
}

fn setting_value(ctx: &ToolContext, key: &str, value: Option<&str>) -> SettingValue {
    let needed_by = ctx
        .registry()
        .domains()
        .iter()
        .filter(|d| d.settings_keys.iter().any(|k| k == key))
        .map(|d| d.name.clone())
        .collect();
    SettingValue {
        key: key.to_owned(),
        value: value.map(|v| shown_value(key, v)),
        is_set: value.is_some(),
        masked: value.is_some() && is_secret_key(key),
        needed_by,
    }
}

// ---------------------------------------------------------------------------
// Time

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CurrentTimeArgs {
    /// IANA timezone name such as `Asia/Seoul`, `Europe/Paris` or `America/New_York`; UTC when omitted.
    #[serde(default)]
    pub timezone: Option<String>,
}

/// The current time in one timezone.
#[derive(Debug, Serialize)]
pub struct CurrentTime {
    pub timezone: String,
    /// RFC 3339, with the zone's offset.
    pub datetime: String,
    pub date: String,
    pub time: String,
    pub weekday: String,
    /// Offset from UTC, e.g. `+09:00`.
    pub utc_offset: String,
    /// Zone abbreviation, e.g. `KST`.
    pub abbreviation: String,
    pub unix_seconds: i64,
}

/// Gives the current date and time in an IANA timezone (default UTC).
///
/// Use it whenever the answer depends on today's date, the day of the week, or the
/// time somewhere in the world.
#[loadout::tool(
    domain = "core",
    keywords = ["time", "date", "now", "today", "timezone", "clock", "시간", "날짜", "오늘"],
    read_only = true,
    idempotent = false,
    open_world = false
)]
pub fn current_time(args: CurrentTimeArgs) -> Result<CurrentTime, ToolError> {
    let name = args
        .timezone
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("UTC");
    let zone = chrono_tz::Tz::from_str(name).map_err(|_| {
        ToolError::execution(format!(
            "unknown timezone `{}`: use an IANA name such as `Asia/Seoul`, `Europe/London` or `UTC`",
            name.chars().take(64).collect::<String>()
        ))
    })?;
    let now = chrono::Utc::now().with_timezone(&zone);
    Ok(CurrentTime {
        timezone: zone.name().to_owned(),
        datetime: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, false),
        date: now.format("%Y-%m-%d").to_string(),
        time: now.format("%H:%M:%S").to_string(),
        weekday: now.format("%A").to_string(),
        utc_offset: now.format("%:z").to_string(),
        abbreviation: now.format("%Z").to_string(),
        unix_seconds: now.timestamp(),
    })
}

// ---------------------------------------------------------------------------
// Arithmetic

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CalculateArgs {
    /// Arithmetic expression, e.g. `(3 + 4) * 2 ^ 3 / sqrt(16)`. Operators `+ - * / % ^`,
    /// parentheses, functions sqrt, abs, ln, log10, sin, cos, tan (radians), min, max,
    /// round (optional digits), floor, ceil; constants pi and e.
    pub expression: String,
}

#[derive(Debug, Serialize)]
pub struct Calculation {
    pub expression: String,
    pub result: f64,
}

/// Evaluates an arithmetic expression exactly as written and returns the number.
///
/// Use it instead of mental arithmetic for anything beyond trivial sums. Supports
/// `+ - * / % ^`, parentheses, sqrt, abs, ln, log10, sin, cos, tan, min, max, round,
/// floor, ceil, pi and e. It is not a code interpreter: no variables or units.
#[loadout::tool(
    domain = "core",
    keywords = ["calculate", "math", "arithmetic", "compute", "sum", "percent", "계산", "수학"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub fn calculate(args: CalculateArgs) -> Result<Calculation, ExpressionError> {
    let result = evaluate(&args.expression)?;
    Ok(Calculation {
        expression: args.expression,
        result,
    })
}

#[cfg(test)]
mod expression_props;
#[cfg(test)]
mod tests;
