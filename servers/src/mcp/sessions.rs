//! Bounded MCP HTTP sessions. Every endpoint (`/mcp`, each `/mcp/domains/a,b`) keeps
//! its sessions in rmcp's [`LocalSessionManager`], wrapped in a [`BoundedSessions`]
//! that records when each session was last used in one [`SessionLedger`] shared by
//! all endpoints. At the cap, a new `initialize` closes the session idle longest, if
//! one has been idle for [`MIN_IDLE_TO_CLOSE`]; otherwise it is answered 503 with
//! `Retry-After` (a flood of `initialize` cannot close the sessions in use).
//! A session is also closed after the idle timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId};
use rmcp::transport::streamable_http_server::{RestoreOutcome, SessionManager};
use tokio_stream::Stream;

/// Default cap on open sessions, over every endpoint: each holds ~100 KB (a worker
/// task, its channels and caches), so ~100 MB at the cap.
pub const DEFAULT_MAX_SESSIONS: u32 = 1_000;
/// Default idle timeout. Clients keep a session open across a user's pauses (an
/// editor left for lunch); rmcp's 5 minutes made them re-initialize often, and the
/// cap, not the timeout, is what bounds memory.
pub const DEFAULT_IDLE_MINUTES: u64 = 30;
/// A session used more recently than this is never closed to make room.
pub const MIN_IDLE_TO_CLOSE: Duration = Duration::from_secs(60);

/// `--mcp-max-sessions`, `--mcp-idle-minutes`.
#[derive(clap::Args, Debug, Clone)]
pub struct SessionArgs {
    /// Most MCP HTTP sessions open at once (all endpoints together); beyond it, the
    /// session idle longest is closed, or `initialize` gets 503 with Retry-After.
    #[arg(long = "mcp-max-sessions", value_name = "N", default_value_t = DEFAULT_MAX_SESSIONS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sessions: u32,
    /// An MCP HTTP session unused for this many minutes is closed.
    #[arg(long = "mcp-idle-minutes", value_name = "MINUTES", default_value_t = DEFAULT_IDLE_MINUTES, value_parser = clap::value_parser!(u64).range(1..=10_080))]
    pub idle_minutes: u64,
}

impl Default for SessionArgs {
    fn default() -> SessionArgs {
        SessionArgs {
            max_sessions: DEFAULT_MAX_SESSIONS,
            idle_minutes: DEFAULT_IDLE_MINUTES,
        }
    }
}

impl SessionArgs {
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_minutes.saturating_mul(60))
    }
}

/// Every open session of every endpoint: when it was last used, and its manager.
pub struct SessionLedger {
    max_sessions: usize,
    idle_timeout: Duration,
    /// [`MIN_IDLE_TO_CLOSE`], but in tests.
    min_idle_to_close: Duration,
    sessions: Mutex<HashMap<SessionId, Entry>>,
}

struct Entry {
    last_used: Instant,
    manager: Weak<LocalSessionManager>,
}

/// Why an `initialize` was not admitted: the cap is reached and no session has been
/// idle long enough to close; a slot may free up after `retry_after`.
#[derive(Debug)]
pub struct Full {
    pub max_sessions: usize,
    pub retry_after: Duration,
}

impl SessionLedger {
    pub fn new(args: &SessionArgs) -> Arc<SessionLedger> {
        Arc::new(SessionLedger {
            max_sessions: usize::try_from(args.max_sessions.max(1)).unwrap_or(usize::MAX),
            idle_timeout: args.idle_timeout(),
            min_idle_to_close: MIN_IDLE_TO_CLOSE,
            sessions: Mutex::new(HashMap::new()),
        })
    }

    /// A new endpoint's session manager, recorded in this ledger.
    pub fn manager(self: &Arc<Self>) -> BoundedSessions {
        let mut inner = LocalSessionManager::default();
        inner.session_config = {
            let mut config = SessionConfig::default();
            config.keep_alive = Some(self.idle_timeout);
            config
        };
        BoundedSessions {
            inner: Arc::new(inner),
            ledger: self.clone(),
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for one more session: at the cap, the session idle longest is closed if
    /// it has been idle for [`MIN_IDLE_TO_CLOSE`]. Concurrent `initialize`s may pass
    /// together and go over the cap by their number (bounded by the listener's
    /// connection cap).
    pub async fn admit(&self) -> Result<(), Full> {
        let victim = {
            let sessions = self.lock();
            if sessions.len() < self.max_sessions {
                return Ok(());
            }
            let Some((id, entry)) = sessions.iter().min_by_key(|(_, e)| e.last_used) else {
                return Ok(());
            };
            let idle = entry.last_used.elapsed();
            if idle < self.min_idle_to_close {
                return Err(Full {
                    max_sessions: self.max_sessions,
                    retry_after: self.min_idle_to_close - idle,
                });
            }
            (id.clone(), entry.manager.clone())
        };
        let (id, manager) = victim;
        tracing::info!("MCP sessions at the cap: closing the one idle longest");
        if let Some(manager) = manager.upgrade() {
            // Its worker ends, and its entry goes with it.
            let _ = SessionManager::close_session(&*manager, &id).await;
        }
        self.lock().remove(&id);
        Ok(())
    }

    fn touch(&self, id: &SessionId) {
        if let Some(entry) = self.lock().get_mut(id) {
            entry.last_used = Instant::now();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Entry>> {
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// rmcp's [`LocalSessionManager`], recording each session's use in the ledger.
pub struct BoundedSessions {
    inner: Arc<LocalSessionManager>,
    ledger: Arc<SessionLedger>,
}

impl SessionManager for BoundedSessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = SessionManager::create_session(&*self.inner).await?;
        self.ledger.lock().insert(
            id.clone(),
            Entry {
                last_used: Instant::now(),
                manager: Arc::downgrade(&self.inner),
            },
        );
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.ledger.touch(id);
        SessionManager::initialize_session(&*self.inner, id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        SessionManager::has_session(&*self.inner, id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.ledger.lock().remove(id);
        SessionManager::close_session(&*self.inner, id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.ledger.touch(id);
        SessionManager::create_stream(&*self.inner, id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.ledger.touch(id);
        SessionManager::accept_message(&*self.inner, id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.ledger.touch(id);
        SessionManager::create_standalone_stream(&*self.inner, id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.ledger.touch(id);
        SessionManager::resume(&*self.inner, id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        SessionManager::restore_session(&*self.inner, id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the cap, the session idle longest is the one closed; one used since is kept.
    #[tokio::test]
    async fn the_session_idle_longest_is_closed_first() {
        let args = SessionArgs {
            max_sessions: 2,
            idle_minutes: 30,
        };
        let ledger = SessionLedger::new(&args);
        let ledger = Arc::new(SessionLedger {
            min_idle_to_close: Duration::ZERO,
            max_sessions: ledger.max_sessions,
            idle_timeout: ledger.idle_timeout,
            sessions: Mutex::new(HashMap::new()),
        });
        let now = Instant::now();
        for (id, idle) in [("older", 20), ("newer", 10)] {
            ledger.lock().insert(
                SessionId::from(id),
                Entry {
                    last_used: now - Duration::from_secs(idle),
                    manager: Weak::new(),
                },
            );
        }
        ledger.touch(&SessionId::from("older"));
        ledger.admit().await.expect("room made");
        let left: Vec<String> = ledger.lock().keys().map(|k| k.to_string()).collect();
        assert_eq!(left, ["older"]);
        // Under the cap, nothing is closed.
        ledger.admit().await.expect("room");
        assert_eq!(ledger.len(), 1);
    }
}
