//! The `[servers]` table of `loadout.toml`: each entry checked, with every problem
//! reported at once, and the names its tools take.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use reqwest::header::{HeaderName, HeaderValue};
use serde::Deserialize;

use super::TRANSPORT_HEADERS;

/// One `[servers.<name>]` entry.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// stdio: the program to run.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// Streamable HTTP: the endpoint.
    pub url: Option<String>,
    /// Streamable HTTP: headers sent with every request (e.g. `Authorization`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Routing keywords for the domain.
    #[serde(default)]
    pub keywords: Vec<String>,
    /// Domain description; default: the server's instructions or name.
    pub description: Option<String>,
    /// Settings the domain needs before its tools run (like any domain's).
    #[serde(default)]
    pub settings_keys: Vec<String>,
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
    /// Longest a forwarded call may take.
    pub timeout_secs: Option<u64>,
}

fn enabled_by_default() -> bool {
    true
}

/// Names only for `env` and `headers`: their values are often credentials.
impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("url", &self.url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("keywords", &self.keywords)
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

/// The enabled servers of the config file's `[servers]` table by domain slug, and
/// every problem with any entry (each naming its `servers.<name>` key).
pub(crate) fn check_servers(
    entries: BTreeMap<String, ServerConfig>,
) -> (Vec<(String, ServerConfig)>, Vec<String>) {
    let mut problems = Vec::new();
    let mut servers = Vec::new();
    let mut domains = HashSet::new();
    for (name, config) in entries {
        let key = format!("servers.{name}");
        let Some(slug) = server_slug(&name) else {
            problems.push(format!(
                "{key}: server names use a-z, 0-9, `_` and `-`, at most 40 characters"
            ));
            continue;
        };
        if !domains.insert(slug.clone()) {
            problems.push(format!(
                "{key}: another server's name maps to `mcp_{slug}` too"
            ));
            continue;
        }
        match (&config.command, &config.url) {
            (Some(_), Some(_)) => {
                problems.push(format!("{key}: give `command` or `url`, not both"))
            }
            (None, None) => problems.push(format!(
                "{key}: give `command` (a stdio server) or `url` (an HTTP server)"
            )),
            (Some(command), None) => {
                if command.trim().is_empty() {
                    problems.push(format!("{key}: `command` is empty"));
                }
                if !config.headers.is_empty() {
                    problems.push(format!(
                        "{key}: `headers` are for HTTP servers (`url`), not `command`"
                    ));
                }
            }
            (None, Some(url)) => {
                if let Err(why) = check_url(url) {
                    problems.push(format!("{key}: `url` {why}"));
                }
                if let Err(header_problems) = http_headers(&config.headers) {
                    problems.extend(header_problems.into_iter().map(|p| format!("{key}: {p}")));
                }
                let stdio_only: Vec<&str> = [
                    (!config.args.is_empty()).then_some("`args`"),
                    (!config.env.is_empty()).then_some("`env`"),
                    config.cwd.is_some().then_some("`cwd`"),
                ]
                .into_iter()
                .flatten()
                .collect();
                if !stdio_only.is_empty() {
                    problems.push(format!(
                        "{key}: {} only apply to stdio servers (`command`), not `url`",
                        stdio_only.join(", ")
                    ));
                }
            }
        }
        if config.enabled {
            servers.push((slug, config));
        }
    }
    (servers, problems)
}

/// Why `url` cannot be an MCP endpoint, if it cannot. The URL itself is not
/// quoted back: it may carry a credential.
fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url.trim()).map_err(|e| format!("is not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "must be http:// or https://, not `{}:`",
            parsed.scheme()
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("has no host".into());
    }
    Ok(())
}

/// The configured headers as the transport takes them, or every problem with
/// them. A problem names the header, never its value.
pub(super) fn http_headers(
    headers: &BTreeMap<String, String>,
) -> Result<HashMap<HeaderName, HeaderValue>, Vec<String>> {
    let mut parsed = HashMap::new();
    let mut problems = Vec::new();
    for (name, value) in headers {
        let Ok(header) = HeaderName::from_bytes(name.trim().as_bytes()) else {
            problems.push(format!("`headers.{name}` is not a valid header name"));
            continue;
        };
        if TRANSPORT_HEADERS.contains(&header.as_str()) {
            problems.push(format!(
                "`headers.{name}` is set by the MCP transport and cannot be configured"
            ));
            continue;
        }
        match HeaderValue::from_str(value.trim()) {
            Ok(mut value) => {
                // Keeps the value out of any `Debug` output of the request.
                value.set_sensitive(true);
                parsed.insert(header, value);
            }
            Err(_) => problems.push(format!(
                "`headers.{name}` has a value that is not a valid header value (control characters?)"
            )),
        }
    }
    if problems.is_empty() {
        Ok(parsed)
    } else {
        Err(problems)
    }
}

/// `my-server` → `my_server`; `None` if the name has other characters.
fn server_slug(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    ok.then(|| name.to_ascii_lowercase().replace('-', "_"))
}

/// `<server>__<tool>`, kept to `[a-z0-9_-]{1,64}`; a name that had to be changed
/// or cut gets a short hash of the original so two tools stay apart. A camelCase
/// name keeps its words apart (`startEngine` → `start_engine`): the router reads a
/// name's words.
pub(super) fn tool_name(server: &str, tool: &str) -> String {
    let mut cleaned = String::with_capacity(tool.len() + 4);
    let mut after_word_char = false;
    for c in tool.chars() {
        match c {
            'a'..='z' | '0'..='9' | '_' | '-' => cleaned.push(c),
            'A'..='Z' => {
                if after_word_char {
                    cleaned.push('_');
                }
                cleaned.push(c.to_ascii_lowercase());
            }
            _ => cleaned.push('_'),
        }
        after_word_char = c.is_ascii_lowercase() || c.is_ascii_digit();
    }
    let name = format!("{server}__{cleaned}");
    let lossless = cleaned == tool;
    if name.len() <= 64 && lossless {
        return name;
    }
    let hash = format!("{:08x}", fnv1a(tool.as_bytes()) as u32);
    let keep = name.len().min(64 - 1 - hash.len());
    format!("{}_{hash}", &name[..keep])
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}
