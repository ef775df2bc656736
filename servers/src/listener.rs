//! The one accept loop of every HTTP listener (`loadout serve`, `loadout mcp --http`),
//! with the limits axum's own `serve` lacks: a client must send a request's headers
//! within a time (which also closes idle keep-alive connections), a request body may
//! not pause longer than a time, at most so many connections are open at once, and
//! a shutdown waits for open connections only so long.
//!
//! Without them, an idle or half-sent request stayed open forever, and some 20,000 of
//! them exhausted the open-file limit so that new clients timed out.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How long each connection may take, and how many there may be.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// From the moment a request is awaited (a new connection, or a kept-alive one
    /// between requests) until its headers are complete.
    pub header_read: Duration,
    /// Longest pause inside a request body.
    pub body_pause: Duration,
    /// Open connections at once; the next client waits in the listen backlog.
    pub max_connections: usize,
    /// How long a shutdown waits for open connections (a request in flight, a
    /// stuck tool, an open event stream) before closing them.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read: Duration::from_secs(30),
            body_pause: Duration::from_secs(30),
            max_connections: default_max_connections(),
            drain: Duration::from_secs(10),
        }
    }
}

/// 1,024, or half the open-file limit when that is lower: the rest is for the
/// database, the upstream servers and the clients' own files.
fn default_max_connections() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let soft = limit.current.unwrap_or(u64::MAX);
    usize::try_from(soft / 2)
        .unwrap_or(usize::MAX)
        .clamp(16, 1024)
}

/// Serves `router` on `listener` until `shutdown` completes, then waits up to
/// `limits.drain` for the open connections to finish. HTTP/1.1 only: every client
/// of loadout speaks it, and the header timeout bounds it from the first byte.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let router = router.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        limits.body_pause,
    ));
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .keep_alive(true);
    tokio::pin!(shutdown);
    let mut at_capacity_since: Option<std::time::Instant> = None;
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
            // Say so once a while when the cap holds clients back.
            () = tokio::time::sleep(Duration::from_secs(5)), if slots.available_permits() == 0 => {
                let since = at_capacity_since.get_or_insert_with(std::time::Instant::now);
                tracing::warn!(
                    "{} connections open (the most allowed) for {:.0} s: new clients wait",
                    limits.max_connections,
                    since.elapsed().as_secs_f64()
                );
                continue;
            }
        };
        at_capacity_since = None;
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or a connection that went away while
                    // queued: pause rather than spin, as axum's serve does.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small responses and events go out at once instead of waiting on Nagle's
        // algorithm for the client's delayed ACK.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY not set: {e}");
        }
        let service = TowerToHyperService::new(router.clone());
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection closed: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.drain) => {
            tracing::warn!(
                "{} connections still open {} s after the shutdown began: closing them",
                limits.max_connections - slots.available_permits(),
                limits.drain.as_secs()
            );
        }
    }
}
