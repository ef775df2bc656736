//! One module per subcommand.

/// `println!` that returns the write's error instead of panicking: when the reader
/// goes away (`loadout route … | head -1`) the command ends quietly (see
/// [`crate::is_broken_pipe`]) after its own clean-up.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

pub mod audit;
pub mod call;
pub mod clients;
pub mod decisions;
pub mod fit;
pub mod learned;
pub mod replay;
pub mod route;
pub mod settings;
pub mod tools;

use std::path::Path;

use crate::app::{App, with_toolkits};
use crate::mcp::connect_upstream_tools;
use crate::mcp::upstream::Upstreams;

/// The app over what `loadout serve` would route: the linked domains, the toolkit
/// files of `catalog`, and (unless `no_upstream`) the config file's upstream
/// servers, connected until the returned [`Upstreams`] are shut down.
async fn as_served(
    app: &App,
    catalog: Option<&Path>,
    no_upstream: bool,
) -> anyhow::Result<(App, Upstreams)> {
    let registry = match catalog {
        Some(dir) => with_toolkits(&app.registry, dir)?,
        None => app.registry.clone(),
    };
    let (registry, upstreams) = if no_upstream {
        (registry, Upstreams::none())
    } else {
        connect_upstream_tools(app, registry).await
    };
    Ok((app.with_other_registry(registry), upstreams))
}
