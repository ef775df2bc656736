//! `loadout serve`: the chat and dashboard server (axum).
//!
//! `app()` builds the whole router from state, so tests drive it with `oneshot`
//! and no socket. One module per resource; `error.rs` maps every failure to a
//! status and a JSON body.

mod auth;
mod domains;
mod error;
mod extract;
mod openapi;
mod route;
mod sessions;
mod settings;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use tower_http::timeout::TimeoutLayer;

use crate::app::App;

pub use error::ApiError;

/// Largest request body accepted (a chat message with some history).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Longest a request may take, model round-trips included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on; anything but loopback requires a bearer token.
    #[arg(long, default_value = "127.0.0.1:7878")]
    addr: SocketAddr,
}

/// What every handler can reach.
#[derive(Clone, Debug)]
pub struct HttpState {
    pub app: App,
    /// Required bearer token, when the server is reachable beyond loopback.
    pub token: Option<Arc<str>>,
}

/// The whole HTTP application.
pub fn app(state: HttpState) -> Router {
    let api = Router::new()
        .route("/api/sessions", post(sessions::create))
        .route("/api/sessions/{id}", get(sessions::show))
        .route("/api/settings", get(settings::list))
        .route(
            "/api/settings/{key}",
            get(settings::show).put(settings::put).delete(settings::delete),
        )
        .route("/api/domains", get(domains::list))
        .route("/api/route", post(route::route))
        .route("/openapi.json", get(openapi::document))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_token));
    api.layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TimeoutLayer::with_status_code(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .with_state(state)
}

pub async fn run(app: App, args: Args) -> anyhow::Result<ExitCode> {
    let token = auth::token_for(args.addr)?;
    let state = HttpState { app, token };
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let local = listener.local_addr()?;
    eprintln!("loadout: serving on http://{local}");
    axum::serve(listener, self::app(state))
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    Ok(ExitCode::SUCCESS)
}

/// Ctrl-C or SIGTERM: stop accepting, finish requests in flight.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}
