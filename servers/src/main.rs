//! The `loadout` binary: parses the command line and runs it on a tokio runtime.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Parser;
use loadout_server::Cli;

// mimalloc frees a block another thread allocated without taking a lock. Under glibc's
// malloc the request threads and the decision log's thread (which frees the rows the
// request threads built) wait on arena locks a few hundred times a second. With
// mimalloc, saturated `/api/route` with the decision log on served 38.4k requests/s
// against 35.4k (`cargo xtask bench-route`, 2 cores, means of 3 and 2 runs), for
// about 8 MB more resident memory.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // The data dir holds credentials (`llm_api_key`) and conversations: every file and
    // folder loadout creates is its user's alone (0600, 0700).
    rustix::process::umask(rustix::fs::Mode::from_bits_truncate(0o077));
    let cli = Cli::parse();
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // The log filter is the log's own: the OpenTelemetry layer, when a collector is
    // configured, takes its spans whatever the log's level.
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colours only on a terminal: escape codes in a log file or a pipe are noise.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_env("LOADOUT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rmcp=error")),
        );
    let (otel, telemetry) = match loadout_server::telemetry::layer() {
        Ok(Some((layer, telemetry))) => (Some(layer), Some(telemetry)),
        Ok(None) => (None, None),
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::registry().with(log).with(otel).init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(loadout_server::run(cli)) {
        Ok(code) => code,
        Err(e) if loadout_server::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    // Dropping the runtime would wait for every blocking task, a tool stuck in a
    // system call among them: the exit waits a moment, not forever.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    code
}
