//! What each setting key is, who may set it, and which values it takes.
//!
//! A domain (or the server, for its own keys) declares each key once with
//! [`setting!`](crate::setting): its [`SettingKind`], its [`Trust`] and a validator.
//! Every write is checked against the declaration before it reaches the store, so a
//! value that cannot work is refused with the reason when it is set, not when a tool
//! later trips over it.
//!
//! The model is not the operator: [`Setter::Model`] (the `set_setting` tool) may set
//! credentials and names a user gives it in chat, never a key that widens what tools
//! can reach or changes where data goes. Those are [`Trust::Operator`], the default:
//! a declaration says `trust: Trust::Model` to let the model set a key, and a key
//! nobody declared (toolkit files, upstream servers) is the model's only when it is
//! named like a credential (`*_api_key`, `*_token`, `*_password`, …; see
//! [`is_credential_key`]). `cargo xtask lint` refuses a key that names a place (a
//! host, path, URL, socket or repository) declared `Model`.

/// Who may set a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// The model may set it (`set_setting`): credentials, names, preferences.
    Model,
    /// Only the operator: the dashboard, the settings API or the CLI.
    Operator,
}

/// When a new value takes effect in a running `serve` or `mcp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Applies {
    /// At the next read (a turn, a tool call): without a restart.
    Live,
    /// Read once at start: a running process keeps the old value until it restarts.
    Restart,
}

/// Who is setting a key now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setter {
    /// A tool call, on behalf of the model.
    Model,
    /// The dashboard, `PUT /api/settings/{key}` or `loadout settings set`.
    Operator,
}

/// The shape of a setting's value; each kind checks what it can on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "values")]
pub enum SettingKind {
    /// Free text on one line (a model's name).
    Text,
    /// A credential: one line, never shown back in full.
    Secret,
    /// An `http://` or `https://` URL with a host.
    Url,
    /// One of a fixed set of words.
    Choice(&'static [&'static str]),
    /// Whatever the validator accepts (paths, numbers, JSON).
    Custom,
}

/// Longest value any setting takes, in characters.
pub const MAX_VALUE_CHARS: usize = 16 * 1024;

/// Checks a value beyond its kind; `Err` says why it cannot work.
pub type Validator = fn(&str) -> Result<(), String>;

/// The link-time declaration [`setting!`](crate::setting) submits.
#[derive(Debug)]
pub struct SettingEntry {
    pub key: &'static str,
    pub kind: SettingKind,
    pub trust: Trust,
    /// When a new value takes effect.
    pub applies: Applies,
    /// One sentence: what the key does, for error messages and listings.
    pub description: &'static str,
    pub validate: Validator,
}

inventory::collect!(SettingEntry);

/// A validator that accepts whatever the kind accepts.
pub fn any_value(_: &str) -> Result<(), String> {
    Ok(())
}

/// Why a setting was not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingRefused {
    #[error(
        "`{key}` is set by the operator, not by a tool: it changes what tools can reach or where data goes. Ask the user to set it from the dashboard, the settings API (PUT /api/settings/{key}) or the CLI (`loadout settings set {key} VALUE`)"
    )]
    OperatorOnly { key: String },
    #[error("invalid value for `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

/// The declaration of `key`, if any linked crate made one.
pub fn setting_spec(key: &str) -> Option<&'static SettingEntry> {
    inventory::iter::<SettingEntry>
        .into_iter()
        .find(|entry| entry.key == key)
}

/// Every declared key, sorted by key.
pub fn setting_specs() -> Vec<&'static SettingEntry> {
    let mut specs: Vec<_> = inventory::iter::<SettingEntry>.into_iter().collect();
    specs.sort_by_key(|s| s.key);
    specs
}

/// Who may set `key`: its declaration, or, undeclared, the model for a credential
/// ([`is_credential_key`]) and the operator for everything else (`imap_host`,
/// `docker_socket_path`, `backup_repository`, `*_url`: where a tool connects or
/// what it reaches).
pub fn trust_of(key: &str) -> Trust {
    match setting_spec(key) {
        Some(spec) => spec.trust,
        None if is_credential_key(key) && !names_a_place(key) => Trust::Model,
        None => Trust::Operator,
    }
}

/// Last words of a key that make it a credential a user may give in chat.
const CREDENTIAL_SUFFIXES: [&str; 9] = [
    "api_key",
    "key",
    "token",
    "password",
    "passphrase",
    "secret",
    "user",
    "username",
    "login",
];

/// Words of a key that name where a tool connects or what it reaches.
const PLACE_WORDS: [&str; 17] = [
    "host",
    "hostname",
    "hosts",
    "url",
    "urls",
    "uri",
    "endpoint",
    "server",
    "address",
    "addr",
    "path",
    "paths",
    "dir",
    "directory",
    "root",
    "roots",
    "socket",
];

/// Whether `key` names a credential: its last word (after `_`) is one of
/// [`CREDENTIAL_SUFFIXES`] (`weather_api_key`, `github_token`, `imap_password`).
pub fn is_credential_key(key: &str) -> bool {
    CREDENTIAL_SUFFIXES
        .iter()
        .any(|suffix| key == *suffix || key.ends_with(&format!("_{suffix}")))
}

/// Whether `key` names a place (a host, URL, path, socket or repository): one of its
/// words is one of [`PLACE_WORDS`], or `repository`/`repo`.
pub fn names_a_place(key: &str) -> bool {
    key.split('_')
        .any(|word| PLACE_WORDS.contains(&word) || word == "repository" || word == "repo")
}

/// When a new value of `key` takes effect: its declaration's, and at once for keys
/// nobody declared (tools read them at each call).
pub fn applies_of(key: &str) -> Applies {
    setting_spec(key).map_or(Applies::Live, |spec| spec.applies)
}

/// Where missing keys are set, for the advice given to the user and the model: the
/// model may store its keys with `set_setting` when the user gives them, but only the
/// operator sets the others, so telling the model to store those sends it into a
/// refusal.
pub fn where_to_set<S: AsRef<str>>(keys: &[S]) -> String {
    let (operator, model): (Vec<&str>, Vec<&str>) = keys
        .iter()
        .map(AsRef::as_ref)
        .partition(|key| trust_of(key) == Trust::Operator);
    let mut parts = Vec::new();
    if !model.is_empty() {
        parts.push(format!(
            "set {} with the `set_setting` tool when the user gives it",
            model.join(", ")
        ));
    }
    if !operator.is_empty() {
        parts.push(format!(
            "the operator sets {} from the dashboard or `loadout settings set` (`set_setting` may not)",
            operator.join(", ")
        ));
    }
    parts.join("; ")
}

/// Whether `setter` may write `value` to `key` (`None`: remove it). A removal by the
/// operator is always allowed; the model may touch no operator key at all.
pub fn check_setting(key: &str, value: Option<&str>, setter: Setter) -> Result<(), SettingRefused> {
    crate::validate_setting_key(key).map_err(|e| SettingRefused::Invalid {
        key: key.chars().take(80).collect(),
        reason: e.to_string(),
    })?;
    if setter == Setter::Model && trust_of(key) == Trust::Operator {
        return Err(SettingRefused::OperatorOnly { key: key.into() });
    }
    let Some(value) = value else {
        return Ok(());
    };
    check_value(key, value).map_err(|reason| SettingRefused::Invalid {
        key: key.into(),
        reason,
    })
}

/// Checks a value against the key's kind and validator (undeclared keys: only the
/// common limits).
pub fn check_value(key: &str, value: &str) -> Result<(), String> {
    let n_chars = value.chars().count();
    if n_chars > MAX_VALUE_CHARS {
        return Err(format!(
            "{n_chars} characters; a setting takes at most {MAX_VALUE_CHARS}"
        ));
    }
    if value
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err("it contains control characters".into());
    }
    let Some(spec) = setting_spec(key) else {
        return Ok(());
    };
    match spec.kind {
        SettingKind::Text | SettingKind::Custom => {}
        SettingKind::Secret => {
            if value.trim() != value || value.contains(char::is_whitespace) {
                return Err("a credential has no spaces or line breaks".into());
            }
        }
        SettingKind::Url => check_url(value)?,
        SettingKind::Choice(choices) => {
            if !choices.contains(&value) {
                return Err(format!("`{value}` is not one of {}", choices.join(", ")));
            }
        }
    }
    (spec.validate)(value).map_err(|reason| format!("{reason} ({})", spec.description))
}

/// An absolute `http://` or `https://` URL with a host and no whitespace.
pub fn check_url(value: &str) -> Result<(), String> {
    let rest = value
        .strip_prefix("http://")
        .or_else(|| value.strip_prefix("https://"))
        .ok_or_else(|| {
            format!(
                "`{}` must start with http:// or https://",
                value.chars().take(80).collect::<String>()
            )
        })?;
    if value.contains(char::is_whitespace) {
        return Err("a URL has no spaces".into());
    }
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or("");
    if host.is_empty() || host.starts_with(':') {
        return Err(format!(
            "`{}` has no host",
            value.chars().take(80).collect::<String>()
        ));
    }
    Ok(())
}

/// Declares a setting key once, next to the code that reads it.
///
/// ```ignore
/// loadout::setting! {
///     key: "filesystem_roots",
///     kind: loadout::SettingKind::Custom,
///     trust: loadout::Trust::Operator,
///     description: "the folders the filesystem tools may reach",
///     validate: check_roots,
/// }
/// ```
///
/// `validate` is optional (the kind's own check then decides), and so are `trust`
/// (without it, only the operator sets the key) and `applies` (without it, a new
/// value takes effect at once; `Applies::Restart` for a key read only at start).
#[macro_export]
macro_rules! setting {
    (
        key: $key:expr,
        kind: $kind:expr,
        $(trust: $trust:expr,)?
        $(applies: $applies:expr,)?
        description: $description:literal
        $(, validate: $validate:expr)?
        $(,)?
    ) => {
        const _: () = {
            $crate::__private::inventory::submit! {
                $crate::SettingEntry {
                    key: $key,
                    kind: $kind,
                    trust: $crate::__private::first_trust(&[$($trust)?]),
                    applies: $crate::__private::first_applies(&[$($applies)?]),
                    description: $description,
                    validate: $crate::__private::first_validator(&[$($validate)?]),
                }
            }
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::setting! {
        key: "spec_test_choice",
        kind: SettingKind::Choice(&["on", "off"]),
        trust: Trust::Operator,
        description: "a test switch",
    }

    crate::setting! {
        key: "spec_test_number",
        kind: SettingKind::Custom,
        trust: Trust::Model,
        description: "a test number",
        validate: |v: &str| v.parse::<u32>().map(|_| ()).map_err(|e| format!("`{v}`: {e}")),
    }

    #[test]
    fn advice_says_where_each_key_is_set() {
        assert_eq!(
            where_to_set(&["spec_test_number"]),
            "set spec_test_number with the `set_setting` tool when the user gives it"
        );
        assert_eq!(
            where_to_set(&["spec_test_choice", "spec_test_number", "weather_url"]),
            "set spec_test_number with the `set_setting` tool when the user gives it; the operator sets spec_test_choice, weather_url from the dashboard or `loadout settings set` (`set_setting` may not)"
        );
    }

    #[test]
    fn declared_keys_are_checked_by_kind_and_validator() {
        assert!(check_setting("spec_test_choice", Some("on"), Setter::Operator).is_ok());
        let refused = check_setting("spec_test_choice", Some("bogus"), Setter::Operator);
        assert!(
            matches!(&refused, Err(SettingRefused::Invalid { reason, .. }) if reason.contains("on, off")),
            "{refused:?}"
        );
        assert!(check_setting("spec_test_number", Some("12"), Setter::Model).is_ok());
        assert!(check_setting("spec_test_number", Some("twelve"), Setter::Model).is_err());
        assert!(check_setting("spec_test_number", Some("1\u{0}2"), Setter::Model).is_err());
    }

    #[test]
    fn the_model_sets_no_operator_key() {
        for (key, value) in [
            ("spec_test_choice", Some("on")),
            ("spec_test_choice", None),
            ("some_upstream_url", Some("http://127.0.0.1:1/")),
        ] {
            assert_eq!(
                check_setting(key, value, Setter::Model),
                Err(SettingRefused::OperatorOnly { key: key.into() })
            );
            assert!(check_setting(key, value, Setter::Operator).is_ok());
        }
        // An undeclared credential is the model's to set.
        assert!(check_setting("weather_api_key", Some("abc"), Setter::Model).is_ok());
    }

    crate::setting! {
        key: "spec_test_default_trust",
        kind: SettingKind::Text,
        description: "a key declared without a trust",
    }

    /// Issue 36: undeclared keys that say where a tool connects (`imap_host`,
    /// `docker_socket_path`, `backup_repository`) were the model's, as was every key
    /// not named `*_url`; now only credentials are, and a declaration without a
    /// trust is the operator's.
    #[test]
    fn only_credentials_are_the_models_by_default() {
        for key in [
            "imap_host",
            "smtp_host",
            "docker_socket_path",
            "backup_repository",
            "tracker_url",
            "some_setting",
            "ssh_key_path",
            "spec_test_default_trust",
        ] {
            assert_eq!(trust_of(key), Trust::Operator, "{key}");
        }
        for key in [
            "weather_api_key",
            "github_token",
            "imap_password",
            "imap_username",
            "client_secret",
        ] {
            assert_eq!(trust_of(key), Trust::Model, "{key}");
        }
        assert!(names_a_place("backup_repository") && names_a_place("docker_socket_path"));
        assert!(!names_a_place("llm_model") && !names_a_place("weather_api_key"));
    }

    crate::setting! {
        key: "spec_test_api_key",
        kind: SettingKind::Secret,
        trust: Trust::Model,
        description: "a test credential",
    }

    /// Secrets never reach a log: a refused credential's message does not repeat it.
    #[test]
    fn a_refused_secret_is_not_repeated() {
        let refused = check_setting("spec_test_api_key", Some("sk-very secret"), Setter::Model)
            .expect_err("a space");
        assert!(!refused.to_string().contains("very secret"), "{refused}");
    }

    #[test]
    fn urls_need_a_scheme_and_a_host() {
        assert!(check_url("http://127.0.0.1:11434/v1").is_ok());
        assert!(check_url("https://api.example.com").is_ok());
        for bad in [
            "localhost:11434",
            "http://",
            "https:///v1",
            "http://a b",
            "ftp://x",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }
}
