//! The meta-tools' view of a chat turn: [`TurnControl`] implements
//! [`SessionControl`] over the turn's routed state, which the chat loop shares.
//!
//! Every change re-routes at once (another decision-log row for the same turn) and
//! persists the session's changed domain rows, so the model's next step sees the new
//! selection and the next request, on any replica, sees the new session state.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use loadout::{ControlFuture, SessionControl};
use loadout_router::{DomainState, Selection, SessionError};
use loadout_store::Store;
use serde_json::{Value, json};

use crate::routing::{RoutedTurn, Routing};

/// The routed state of one turn, shared by the chat loop and the meta-tools.
#[derive(Debug)]
pub struct TurnState {
    pub routed: RoutedTurn,
    /// The selection changed since the loop last looked.
    pub changed: bool,
}

/// [`SessionControl`] for one chat turn.
#[derive(Clone)]
pub struct TurnControl {
    pub state: Arc<Mutex<TurnState>>,
    /// Tools the model fetched this turn with `load_tools` or found with
    /// `search_tools`: called with success, they teach the repair signal.
    pub fetched: Arc<Mutex<BTreeSet<String>>>,
    routing: Routing,
    store: Store,
    session: String,
    message: String,
    /// The model called `search_tools` this turn (a later load repairs a miss found
    /// by searching).
    searched: Arc<AtomicBool>,
    /// The client whose token started the turn: `search_tools` finds only its tools.
    client: Option<crate::clients::Client>,
}

impl TurnControl {
    pub fn new(
        routed: RoutedTurn,
        routing: Routing,
        store: Store,
        session: String,
        message: String,
        client: Option<crate::clients::Client>,
    ) -> TurnControl {
        TurnControl {
            state: Arc::new(Mutex::new(TurnState {
                routed,
                changed: false,
            })),
            fetched: Arc::default(),
            routing,
            store,
            session,
            message,
            searched: Arc::new(AtomicBool::new(false)),
            client,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, TurnState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies a change to the session view, re-routes, and persists the changed rows.
    async fn change<F>(&self, apply: F) -> Result<Arc<Selection>, String>
    where
        F: FnOnce(&mut RoutedTurn) -> Result<Vec<DomainState>, SessionError>,
    {
        let (changed_rows, selection, turn, carry) = {
            let mut state = self.lock();
            let rows = apply(&mut state.routed).map_err(|e| e.to_string())?;
            self.routing
                .reselect(&mut state.routed, Some(&self.session), &self.message);
            state.changed = true;
            let routed = &state.routed;
            (
                rows,
                routed.selection.clone(),
                routed.turn,
                routed.carry.clone(),
            )
        };
        self.routing
            .persist(
                &self.store,
                &self.session,
                &changed_rows,
                Some((turn, &carry)),
            )
            .await
            .map_err(|e| format!("the session state could not be saved: {e}"))?;
        Ok(selection)
    }

    /// Domains among `names` (tool or domain names) that still need settings.
    fn needs_settings(&self, names: &[String]) -> Value {
        let state = self.lock();
        let registry = state.routed.router.registry();
        let domains: BTreeSet<&str> = names
            .iter()
            .filter_map(|name| match (registry.domain(name), registry.tool(name)) {
                (Some(domain), _) => Some(domain.name.as_str()),
                (None, Some(tool)) => Some(tool.domain.as_str()),
                (None, None) => None,
            })
            .collect();
        let mut needs = serde_json::Map::new();
        for domain in domains {
            let missing = registry.missing_settings(domain, &state.routed.settings);
            if !missing.is_empty() {
                needs.insert(domain.to_owned(), json!(missing));
            }
        }
        Value::Object(needs)
    }
}

impl SessionControl for TurnControl {
    fn search<'a>(&'a self, query: &'a str, limit: usize) -> ControlFuture<'a> {
        Box::pin(async move {
            self.searched.store(true, Ordering::Relaxed);
            // The query is embedded before the turn's state is locked, outside the router.
            let (router, settings) = {
                let state = self.lock();
                (state.routed.router.clone(), state.routed.settings.clone())
            };
            let vectors = crate::routing::message_vectors(&router, &settings, query).await;
            let state = self.lock();
            let selection = &state.routed.selection;
            let router = &state.routed.router;
            // A client's search ranks every tool and keeps the best of its own, so that
            // it still gets `limit` results.
            let ranked = match &self.client {
                Some(_) => router.registry().all_tools().len(),
                None => limit,
            };
            let mut hints = router.search(
                query,
                Some(&state.routed.settings),
                state.routed.learned.as_deref(),
                vectors.as_ref(),
                ranked,
            );
            // Matches in domains that are not configured: named with the keys to ask for.
            let mut everything = router.search(query, None, None, vectors.as_ref(), ranked);
            if let Some(client) = &self.client {
                hints.retain(|hint| client.may_use(router.registry(), &hint.name));
                everything.retain(|hint| client.may_use(router.registry(), &hint.name));
            }
            hints.truncate(limit);
            everything.truncate(limit);
            let registry = router.registry();
            let mut not_configured: Vec<String> = Vec::new();
            for hint in &everything {
                let missing = registry.missing_settings(&hint.domain, &state.routed.settings);
                let line = format!(
                    "{}: {}",
                    loadout_router::not_configured(&hint.domain, &missing),
                    loadout::where_to_set(&missing)
                );
                if !missing.is_empty() && !not_configured.contains(&line) {
                    not_configured.push(line);
                }
            }
            self.fetched
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(hints.iter().map(|hint| hint.name.to_string()));
            let results: Vec<Value> = hints
                .into_iter()
                .map(|hint| {
                    let mut value = hint.to_json();
                    value["loaded"] = json!(selection.contains(&hint.name));
                    value
                })
                .collect();
            let note = if results.is_empty() {
                "No active tool matched; try other words. list_domains shows domains that need settings first."
            } else {
                "Call load_tools with the names (or a domain) you need; they are callable right after."
            };
            let mut result = json!({"results": results, "note": note});
            if !not_configured.is_empty() {
                result["not_configured"] = json!(not_configured);
            }
            Ok(result)
        })
    }

    fn load<'a>(&'a self, names: &'a [String]) -> ControlFuture<'a> {
        Box::pin(async move {
            let before = self.lock().routed.selection.clone();
            let selection = self
                .change(|routed| routed.view.load(&routed.router, names))
                .await
                .map_err(|e| format!("{e}; search_tools finds names"))?;
            let router = self.lock().routed.router.clone();
            let registry = router.registry();
            let available: Vec<&str> = selection
                .tool_names()
                .filter(|tool| {
                    registry
                        .tool(tool)
                        .is_some_and(|t| names.iter().any(|n| *n == t.name || *n == t.domain))
                })
                .collect();
            // A tool the router had not sent is now callable: a routing miss repaired.
            if available.iter().any(|tool| !before.contains(tool)) {
                let via = if self.searched.load(Ordering::Relaxed) {
                    "search_tools"
                } else {
                    "load_tools"
                };
                crate::metrics::record_miss_repaired(via);
            }
            self.fetched
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(available.iter().map(|name| (*name).to_owned()));
            let mut result = json!({
                "loaded": names,
                "now_available": available,
                "note": "These tools are in your tool list now; call them directly.",
            });
            let needs = self.needs_settings(names);
            if needs.as_object().is_some_and(|n| !n.is_empty()) {
                result["needs_settings"] = needs.clone();
                result["note"] = json!(
                    "Some domains are not configured, so their tools stay unavailable: tell the user what they need. Each domain's how_to_configure says where its keys are set."
                );
                let how: serde_json::Map<String, Value> = needs
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(domain, keys)| {
                        let keys: Vec<&str> = keys
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .collect();
                        (domain.clone(), json!(loadout::where_to_set(&keys)))
                    })
                    .collect();
                result["how_to_configure"] = Value::Object(how);
            }
            Ok(result)
        })
    }

    fn unload<'a>(&'a self, names: &'a [String]) -> ControlFuture<'a> {
        Box::pin(async move {
            let selection = self
                .change(|routed| routed.view.unload(&routed.router, names))
                .await?;
            Ok(json!({"unloaded": names, "n_tools": selection.n_tools}))
        })
    }

    fn load_all_for_this_turn(&self) -> ControlFuture<'_> {
        Box::pin(async move {
            let selection = self
                .change(|routed| {
                    routed.view.load_all_for_this_turn();
                    Ok(Vec::new())
                })
                .await?;
            Ok(json!({
                "n_tools": selection.n_tools,
                "tokens": selection.tokens,
                "note": "Every active tool is in your tool list until the user's next message.",
            }))
        })
    }
}
