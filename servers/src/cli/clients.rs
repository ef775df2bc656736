//! `loadout clients add|list|revoke`: clients told apart by their own bearer token
//! (issue 40). The token is printed once at `add`; the store keeps its SHA-256 only.

use std::process::ExitCode;

use loadout_store::{ClientRow, now_ms, sha256_hex};

use crate::app::App;
use crate::log_writer::iso_utc;
use crate::mcp::BearerToken;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Adds a client and prints its token, once.
    Add {
        /// 1 to 64 letters, digits, `_` or `-`.
        name: String,
        /// The domains it sees (core always), comma-separated; default: every domain.
        #[arg(long, value_delimiter = ',')]
        domains: Vec<String>,
        /// Tools it sees besides those of `--domains`, comma-separated.
        #[arg(long, value_delimiter = ',')]
        tools: Vec<String>,
        /// Most requests a minute, as `N/min` (or `N`).
        #[arg(long, value_name = "N/min")]
        rate: Option<String>,
        /// Only tools marked read-only.
        #[arg(long)]
        read_only: bool,
    },
    /// Lists the clients (never their tokens).
    List,
    /// Removes a client; its token stops working at once.
    Revoke { name: String },
}

pub async fn run(app: &App, command: Command) -> anyhow::Result<ExitCode> {
    let store = app.store();
    match command {
        Command::Add {
            name,
            domains,
            tools,
            rate,
            read_only,
        } => {
            check_name(&name)?;
            let domains = trimmed(domains);
            let tools = trimmed(tools);
            // A misspelt name would otherwise give a client less than meant, silently.
            for domain in &domains {
                if app.registry.domain(domain).is_none() {
                    anyhow::bail!("--domains: no domain is named `{domain}`");
                }
            }
            for tool in &tools {
                if app.registry.tool(tool).is_none() {
                    anyhow::bail!("--tools: no tool is named `{tool}`");
                }
            }
            let rate_per_min = rate.as_deref().map(parse_rate).transpose()?;
            let token = BearerToken::generate()?;
            let row = ClientRow {
                name: name.clone(),
                token_sha256: sha256_hex(token.as_str()),
                domains,
                tools,
                rate_per_min,
                read_only,
                created_ms: now_ms(),
            };
            if !store.client_insert(row).await? {
                anyhow::bail!("a client named `{name}` exists; revoke it first");
            }
            outln!(
                "added client {name}; its token (shown once): {}",
                token.as_str()
            )?;
        }
        Command::List => {
            for client in store.clients_list().await? {
                let list = |items: &[String], all: &str| {
                    if items.is_empty() {
                        all.to_owned()
                    } else {
                        items.join(",")
                    }
                };
                outln!(
                    "{} domains {} tools {} rate {} {}since {}",
                    client.name,
                    list(&client.domains, "all"),
                    list(&client.tools, "-"),
                    client
                        .rate_per_min
                        .map_or("-".to_owned(), |n| format!("{n}/min")),
                    if client.read_only { "read-only " } else { "" },
                    iso_utc(client.created_ms)
                )?;
            }
        }
        Command::Revoke { name } => {
            if !store.client_revoke(&name).await? {
                anyhow::bail!("no client is named `{name}`");
            }
            outln!("revoked client {name}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !ok {
        anyhow::bail!("a client's name is 1 to 64 letters, digits, `_` or `-`: `{name}` is not");
    }
    Ok(())
}

fn trimmed(items: Vec<String>) -> Vec<String> {
    items
        .into_iter()
        .map(|item| item.trim().to_owned())
        .filter(|item| !item.is_empty())
        .collect()
}

/// `30/min` or `30` → 30; at least 1.
fn parse_rate(text: &str) -> anyhow::Result<u32> {
    let number = text.trim().strip_suffix("/min").unwrap_or(text.trim());
    match number.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => anyhow::bail!("--rate: `{text}` is not a number of requests a minute, such as 30/min"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_names_are_checked() {
        assert_eq!(parse_rate("30/min").ok(), Some(30));
        assert_eq!(parse_rate(" 5 ").ok(), Some(5));
        assert!(parse_rate("0/min").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(check_name("agent-1_b").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("with space").is_err());
    }
}
