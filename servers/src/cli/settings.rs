//! `loadout settings get|set|unset|list`.

use std::process::ExitCode;

use loadout::{is_secret_key, mask_secret};

use crate::app::App;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Prints one setting (secret-looking values masked unless --reveal).
    Get {
        key: String,
        #[arg(long)]
        reveal: bool,
    },
    /// Sets a setting.
    Set { key: String, value: String },
    /// Removes a setting.
    Unset { key: String },
    /// Lists every setting (secret-looking values masked).
    List,
}

pub async fn run(app: &App, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Get { key, reveal } => match app.settings.get(&key).await? {
            Some(value) if is_secret_key(&key) && !reveal => outln!("{}", mask_secret(&value))?,
            Some(value) => outln!("{value}")?,
            None => {
                eprintln!("error: `{key}` is not set");
                return Ok(ExitCode::from(2));
            }
        },
        Command::Set { key, value } => {
            app.settings.set(&key, &value).await?;
            outln!("set {key}")?;
            if loadout::applies_of(&key) == loadout::Applies::Restart {
                outln!(
                    "{key} is read at start: restart loadout serve and loadout mcp for it to take effect"
                )?;
            }
        }
        Command::Unset { key } => {
            if app.settings.unset(&key).await? {
                outln!("unset {key}")?;
            } else {
                outln!("{key} was not set")?;
            }
        }
        Command::List => {
            for (key, value) in app.settings.snapshot().await?.iter() {
                let shown = if is_secret_key(key) {
                    mask_secret(value)
                } else {
                    value.clone()
                };
                outln!("{key}={shown}")?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
