//! The running set of upstream servers, brought in line with the configuration
//! at start and on every reload.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::config::{ServerConfig, http_headers};
use super::lock;
use super::supervision::{Endpoint, Status, Upstream};

/// Every configured upstream, connected in the background. The set follows the
/// config file: [`Upstreams::reconcile`] connects servers added to `[servers]` and
/// stops those taken out.
pub struct Upstreams {
    /// `None` once shut down: a reconcile still connecting then stops what it
    /// connected instead of leaving it running.
    pub(super) running: Mutex<Option<Vec<Running>>>,
    /// Handed to each server: tells the owner a tool list changed (and that the set
    /// of servers did, after a reconcile).
    pub(super) changed: mpsc::UnboundedSender<()>,
}

pub(super) struct Running {
    pub(super) upstream: Arc<Upstream>,
    pub(super) supervisor: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams")
            .field("servers", &self.servers().len())
            .finish()
    }
}

/// What [`Upstreams::reconcile`] did, by server slug.
#[derive(Debug, Default, PartialEq)]
pub struct Reconciled {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Servers whose settings changed: stopped and connected again.
    pub restarted: Vec<String>,
}

impl Reconciled {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.restarted.is_empty()
    }
}

impl Upstreams {
    pub fn none() -> Upstreams {
        let (changed, _) = mpsc::unbounded_channel();
        Upstreams::new(changed)
    }

    pub(super) fn new(changed: mpsc::UnboundedSender<()>) -> Upstreams {
        Upstreams {
            running: Mutex::new(Some(Vec::new())),
            changed,
        }
    }

    /// Starts every server and waits (up to the connect timeout) for the first
    /// connection of each, so the first tools/list has their tools. `changed` gets a
    /// message whenever a server's tool list changes later.
    pub async fn start(
        config_path: &Path,
        servers: Vec<(String, ServerConfig)>,
        changed: mpsc::UnboundedSender<()>,
    ) -> Upstreams {
        let upstreams = Upstreams::new(changed);
        upstreams.add(config_path, servers).await;
        upstreams
    }

    /// Connects `servers`, as [`Upstreams::start`] does.
    pub(super) async fn add(&self, config_path: &Path, servers: Vec<(String, ServerConfig)>) {
        let mut added = Vec::new();
        let mut wake_receivers = Vec::new();
        let mut first_connects = tokio::task::JoinSet::new();
        for (slug, config) in servers {
            let endpoint = match &config.url {
                None => Endpoint::Stdio,
                Some(url) => match http_headers(&config.headers) {
                    Ok(headers) => Endpoint::Http {
                        url: Arc::from(url.trim()),
                        headers,
                    },
                    // `load_config` reports these; a caller that skipped it gets
                    // the server left out rather than half-configured.
                    Err(problems) => {
                        eprintln!(
                            "loadout: {}: servers.{slug}: {}; skipped",
                            config_path.display(),
                            problems.join("; ")
                        );
                        continue;
                    }
                },
            };
            let (wake, wake_rx) = mpsc::unbounded_channel();
            let upstream = Arc::new(Upstream {
                origin: format!("{}: servers.{slug}", config_path.display()),
                description: Mutex::new(
                    config
                        .description
                        .clone()
                        .unwrap_or_else(|| format!("Tools of the MCP server `{slug}`.")),
                ),
                slug,
                config,
                endpoint,
                peer: Mutex::new(None),
                status: watch::Sender::new(Status::default()),
                service: tokio::sync::Mutex::new(None),
                stop: Mutex::new(None),
                stopping: AtomicBool::new(false),
                tools: Mutex::new(Vec::new()),
                last_error: Mutex::new(None),
                wake,
                changed: self.changed.clone(),
            });
            let first = upstream.clone();
            first_connects.spawn(async move {
                if let Err(e) = first.attempt().await {
                    eprintln!(
                        "loadout: upstream MCP server `{}`: {e:#}; retrying in the background",
                        first.slug
                    );
                }
            });
            added.push(upstream);
            wake_receivers.push(wake_rx);
        }
        while first_connects.join_next().await.is_some() {}
        // Supervisors start after the first attempts so that they do not race them.
        let started = added
            .into_iter()
            .zip(wake_receivers)
            .map(|(upstream, wake_rx)| {
                let supervisor = tokio::spawn(Arc::clone(&upstream).supervise(wake_rx));
                Running {
                    upstream,
                    supervisor: Some(supervisor),
                }
            });
        let shut_down = match &mut *lock(&self.running) {
            Some(running) => {
                running.extend(started);
                None
            }
            None => Some(started.collect::<Vec<_>>()),
        };
        if let Some(started) = shut_down {
            stop_all(started).await;
        }
    }

    /// The servers as they are now.
    pub fn servers(&self) -> Vec<Arc<Upstream>> {
        lock(&self.running)
            .iter()
            .flatten()
            .map(|r| r.upstream.clone())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        lock(&self.running).as_ref().is_none_or(Vec::is_empty)
    }

    /// Makes the running servers those of `wanted` (the `[servers]` of a config
    /// file read again): stops the servers no longer listed and those whose
    /// settings changed, then connects the new and changed ones (waiting for each
    /// one's first connection, as at start), and tells the owner, which lists the
    /// new set's tools. Servers left as they were keep their connections. Not for
    /// two callers at once.
    pub async fn reconcile(
        &self,
        config_path: &Path,
        wanted: &[(String, ServerConfig)],
    ) -> Reconciled {
        let mut done = Reconciled::default();
        let stopping: Vec<Running> = {
            let mut running = lock(&self.running);
            let Some(running) = running.as_mut() else {
                return done;
            };
            let (stop, keep) = std::mem::take(running).into_iter().partition(|r| {
                wanted
                    .iter()
                    .all(|(slug, config)| *slug != r.upstream.slug || *config != r.upstream.config)
            });
            *running = keep;
            stop
        };
        for r in &stopping {
            if wanted.iter().any(|(slug, _)| *slug == r.upstream.slug) {
                done.restarted.push(r.upstream.slug.clone());
            } else {
                done.removed.push(r.upstream.slug.clone());
            }
        }
        stop_all(stopping).await;
        let running = self.servers();
        let starting: Vec<(String, ServerConfig)> = wanted
            .iter()
            .filter(|(slug, _)| running.iter().all(|r| r.slug != *slug))
            .cloned()
            .collect();
        for (slug, _) in &starting {
            if !done.restarted.contains(slug) {
                done.added.push(slug.clone());
            }
        }
        self.add(config_path, starting).await;
        if !done.is_empty() {
            let _ = self.changed.send(());
        }
        done
    }

    /// Stops every server process (gracefully: stdin closed, then SIGTERM, then
    /// kill) and ends every HTTP session.
    pub async fn shutdown(&self) {
        let running = lock(&self.running).take();
        stop_all(running.unwrap_or_default()).await;
    }
}

/// Stops each server, then waits for its supervisor (see [`Upstreams::shutdown`]).
async fn stop_all(mut running: Vec<Running>) {
    for r in &running {
        let upstream = &r.upstream;
        upstream.stopping.store(true, Ordering::Release);
        *lock(&upstream.peer) = None;
        if let Some(stop) = lock(&upstream.stop).take() {
            stop.cancel();
        }
        if let Some(mut service) = upstream.service.lock().await.take() {
            let _ = service.close_with_timeout(Duration::from_secs(5)).await;
        }
    }
    for r in &mut running {
        let Some(mut handle) = r.supervisor.take() else {
            continue;
        };
        if tokio::time::timeout(Duration::from_secs(6), &mut handle)
            .await
            .is_err()
        {
            handle.abort();
        }
    }
}
