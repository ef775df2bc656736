//! The registry: every domain and tool, validated once, looked up by name.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use crate::schema::ArgsValidator;
use crate::toolkit::Toolkit;
use crate::{Backend, Domain, DomainEntry, RegistryError, Tool, ToolContext, ToolEntry, ToolError};

/// All domains and tools, sorted by name. Immutable once built: a change (a new
/// toolkit, an upstream server's new tool list) builds a new registry.
pub struct Registry {
    domains: Vec<Domain>,
    domain_index: HashMap<String, usize>,
    tools: Vec<Tool>,
    tool_index: HashMap<String, usize>,
    /// Compiled input schemas, built on first call of each tool.
    validators: Vec<OnceLock<Result<ArgsValidator, String>>>,
    /// The wall clock of one call.
    call_timeout: Duration,
}

/// How long one tool call may run before it is stopped and answered with
/// [`ToolError::Timeout`]. Tools that block (files, SQL) bound their own work well
/// within it; this is the backstop for every tool, upstream ones included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("domains", &self.domains.len())
            .field("tools", &self.tools.len())
            .finish()
    }
}

/// Collects domains and tools from several sources, then checks them together.
#[derive(Debug, Default)]
pub struct RegistryBuilder {
    domains: Vec<Domain>,
    tools: Vec<Tool>,
}

impl RegistryBuilder {
    /// Adds everything `#[tool]` and `domain!` submitted in the linked crates.
    pub fn inventory(mut self) -> Self {
        for entry in inventory::iter::<DomainEntry> {
            self.domains.push(Domain::from_entry(entry));
        }
        let tiers: HashMap<&str, crate::Tier> = inventory::iter::<DomainEntry>
            .into_iter()
            .map(|d| (d.name, d.tier))
            .collect();
        for entry in inventory::iter::<ToolEntry> {
            let tier = tiers.get(entry.domain).copied().unwrap_or_default();
            self.tools.push(Tool::from_entry(entry, tier));
        }
        self
    }

    pub fn toolkit(mut self, toolkit: Toolkit) -> Self {
        self.domains.push(toolkit.domain);
        self.tools.extend(toolkit.tools);
        self
    }

    /// Adds every toolkit file of a directory.
    pub fn toolkit_dir(mut self, dir: &Path) -> Result<Self, RegistryError> {
        for toolkit in crate::toolkit::load_dir(dir)? {
            self = self.toolkit(toolkit);
        }
        Ok(self)
    }

    /// Adds a domain built at run time (e.g. an upstream MCP server's tools).
    pub fn domain(mut self, domain: Domain, tools: Vec<Tool>) -> Self {
        self.domains.push(domain);
        self.tools.extend(tools);
        self
    }

    pub fn build(self) -> Result<Registry, RegistryError> {
        Registry::from_parts(self.domains, self.tools)
    }
}

impl Registry {
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// Every domain and tool the linked crates declared.
    pub fn from_inventory() -> Result<Registry, RegistryError> {
        Registry::builder().inventory().build()
    }

    /// Checks names, duplicates and domain references, and indexes the result.
    pub fn from_parts(
        mut domains: Vec<Domain>,
        mut tools: Vec<Tool>,
    ) -> Result<Registry, RegistryError> {
        // Link order is unspecified: sort so that every listing and every error is
        // the same from build to build.
        domains.sort_by(|a, b| a.name.cmp(&b.name).then(a.origin.cmp(&b.origin)));
        tools.sort_by(|a, b| a.name.cmp(&b.name).then(a.origin.cmp(&b.origin)));

        let mut domain_index = HashMap::with_capacity(domains.len());
        for (i, domain) in domains.iter().enumerate() {
            check_name("domain", &domain.name, &domain.origin, false)?;
            if let Some(&first) = domain_index.get(&domain.name) {
                let first: &Domain = &domains[first];
                return Err(RegistryError::DuplicateDomain {
                    name: domain.name.clone(),
                    first: first.origin.clone(),
                    second: domain.origin.clone(),
                });
            }
            domain_index.insert(domain.name.clone(), i);
        }

        let mut tool_index = HashMap::with_capacity(tools.len());
        let mut tools_by_domain: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (i, tool) in tools.iter().enumerate() {
            check_name("tool", &tool.name, &tool.origin, true)?;
            if let Some(&first) = tool_index.get(&tool.name) {
                let first: &Tool = &tools[first];
                return Err(RegistryError::DuplicateTool {
                    name: tool.name.clone(),
                    first: first.origin.clone(),
                    second: tool.origin.clone(),
                });
            }
            let Some(&domain_idx) = domain_index.get(&tool.domain) else {
                return Err(RegistryError::UndeclaredDomain {
                    tool: tool.name.clone(),
                    domain: tool.domain.clone(),
                    origin: tool.origin.clone(),
                });
            };
            tools_by_domain
                .entry(domain_idx)
                .or_default()
                .push(tool.name.clone());
            tool_index.insert(tool.name.clone(), i);
        }
        for (domain_idx, names) in tools_by_domain {
            domains[domain_idx].tools = names;
        }
        let n_tools = tools.len();
        Ok(Registry {
            domains,
            domain_index,
            tools,
            tool_index,
            validators: (0..n_tools).map(|_| OnceLock::new()).collect(),
            call_timeout: CALL_TIMEOUT,
        })
    }

    /// The same registry with another wall clock per call (tests, short-lived tools).
    pub fn with_call_timeout(mut self, timeout: Duration) -> Registry {
        self.call_timeout = timeout;
        self
    }

    /// A new registry with the toolkit files of `dir` added.
    pub fn with_toolkit_dir(&self, dir: &Path) -> Result<Registry, RegistryError> {
        let mut builder = RegistryBuilder {
            domains: self.domains.clone(),
            tools: self.tools.clone(),
        };
        builder = builder.toolkit_dir(dir)?;
        builder.build()
    }

    pub fn domains(&self) -> &[Domain] {
        &self.domains
    }

    pub fn all_tools(&self) -> &[Tool] {
        &self.tools
    }

    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domain_index.get(name).map(|&i| &self.domains[i])
    }

    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tool_index.get(name).map(|&i| &self.tools[i])
    }

    /// Position of a tool in [`all_tools`](Self::all_tools): a dense id for the router.
    pub fn tool_idx(&self, name: &str) -> Option<usize> {
        self.tool_index.get(name).copied()
    }

    pub fn domain_idx(&self, name: &str) -> Option<usize> {
        self.domain_index.get(name).copied()
    }

    /// The tools of a domain, in name order.
    pub fn tools_of<'a>(&'a self, domain: &'a Domain) -> impl Iterator<Item = &'a Tool> + 'a {
        domain.tools.iter().filter_map(|name| self.tool(name))
    }

    /// Settings keys a domain still needs, given the current settings.
    pub fn missing_settings(
        &self,
        domain: &str,
        settings: &BTreeMap<String, String>,
    ) -> Vec<String> {
        self.domain(domain)
            .map(|d| {
                d.missing_settings(|key| settings.get(key).is_some_and(|v| !v.trim().is_empty()))
                    .into_iter()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Checks arguments against the tool's input schema without calling it.
    pub fn validate(&self, name: &str, args: &Value) -> Result<(), ToolError> {
        let idx = self.tool_idx(name).ok_or_else(|| ToolError::UnknownTool {
            name: name.chars().take(128).collect(),
        })?;
        let tool = &self.tools[idx];
        let validator = self.validators[idx].get_or_init(|| ArgsValidator::new(&tool.input_schema));
        match validator {
            Ok(validator) => validator.check(args).map_err(|v| ToolError::InvalidArgs {
                field: v.field,
                message: v.message,
            }),
            Err(message) => Err(ToolError::Execution(format!(
                "tool `{name}` has an invalid input schema: {message}"
            ))),
        }
    }

    /// Validates, checks the domain's settings, then runs the tool. The body never
    /// runs on invalid arguments or an unconfigured domain; a panic in it becomes
    /// [`ToolError::Panicked`].
    pub async fn call(
        &self,
        name: &str,
        args: Value,
        ctx: ToolContext,
    ) -> Result<Value, ToolError> {
        match self.run(name, args, ctx, false).await? {
            CallOutput::Value(value) | CallOutput::Raw(value) => Ok(value),
        }
    }

    /// [`Registry::call`], except that a backend with a result of its own protocol
    /// ([`ExternalCall::call_raw`](crate::ExternalCall::call_raw)) returns that
    /// unflattened: what an MCP server passes on from an upstream MCP server.
    pub async fn call_passthrough(
        &self,
        name: &str,
        args: Value,
        ctx: ToolContext,
    ) -> Result<CallOutput, ToolError> {
        self.run(name, args, ctx, true).await
    }

    async fn run(
        &self,
        name: &str,
        args: Value,
        ctx: ToolContext,
        raw: bool,
    ) -> Result<CallOutput, ToolError> {
        // Clients send `null` or nothing for tools without parameters.
        let args = if args.is_null() {
            Value::Object(Default::default())
        } else {
            args
        };
        self.validate(name, &args)?;
        let tool = self.tool(name).ok_or_else(|| ToolError::UnknownTool {
            name: name.to_owned(),
        })?;
        // A domain that needs no settings skips the read: its tools (`calculate`,
        // `current_time`) keep working while the state backend is away.
        let needs_settings = self
            .domain(&tool.domain)
            .is_some_and(|d| !d.settings_keys.is_empty());
        if needs_settings {
            let settings = ctx.settings().snapshot().await?;
            let missing = self.missing_settings(&tool.domain, &settings);
            if !missing.is_empty() {
                return Err(ToolError::NotConfigured {
                    domain: tool.domain.clone(),
                    missing,
                });
            }
        }
        let (future, is_raw) = match &tool.backend {
            Backend::Native(call) => (call(ctx, args), false),
            Backend::External(external) => {
                match raw
                    .then(|| external.call_raw(&tool.name, args.clone()))
                    .flatten()
                {
                    Some(future) => (future, true),
                    None => (external.call(&tool.name, args), false),
                }
            }
            Backend::None => {
                return Err(ToolError::NoBackend {
                    name: tool.name.clone(),
                });
            }
        };
        let mut task = tokio::spawn(future);
        let value = match tokio::time::timeout(self.call_timeout, &mut task).await {
            Ok(Ok(result)) => result?,
            Ok(Err(join_error)) => {
                return Err(ToolError::Panicked {
                    name: tool.name.clone(),
                    message: panic_message(join_error),
                });
            }
            Err(_) => {
                // The task ends at its next await; a tool blocked in a system call
                // on a blocking thread is bounded by its own limits.
                task.abort();
                return Err(ToolError::Timeout {
                    name: tool.name.clone(),
                    seconds: self.call_timeout.as_secs().max(1),
                });
            }
        };
        Ok(if is_raw {
            CallOutput::Raw(value)
        } else {
            CallOutput::Value(value)
        })
    }
}

/// What [`Registry::call_passthrough`] returns.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutput {
    /// A plain value: text or JSON.
    Value(Value),
    /// The backend's own protocol result (see `ExternalCall::call_raw`).
    Raw(Value),
}

fn panic_message(error: tokio::task::JoinError) -> String {
    if !error.is_panic() {
        return "cancelled".into();
    }
    let payload = error.into_panic();
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

/// Tool names: `[a-z0-9_-]{1,64}` (OpenAI's limit); domain names: `[a-z0-9_]{1,64}`.
fn check_name(
    what: &'static str,
    name: &str,
    origin: &str,
    allow_dash: bool,
) -> Result<(), RegistryError> {
    let reason = if name.is_empty() {
        Some("empty")
    } else if name.len() > 64 {
        Some("longer than 64 characters")
    } else if !name.bytes().all(|b| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || (allow_dash && b == b'-')
    }) {
        Some(if allow_dash {
            "use only a-z, 0-9, `_` and `-`"
        } else {
            "use only a-z, 0-9 and `_`"
        })
    } else {
        None
    };
    match reason {
        Some(reason) => Err(RegistryError::InvalidName {
            what,
            name: name.to_owned(),
            origin: origin.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}
