//! The router's view of a session, and the pure updates the server and the eval both
//! apply to it: tool calls, meta-tool loads and unloads, and the turn clock.
//!
//! The server builds a [`SessionView`] from the store before routing and persists the
//! [`DomainState`] rows the updates return; the eval keeps the view in memory.

use serde::Serialize;

use super::Router;
use super::selection::{Selection, Stage};

/// The router's memory of one domain in one session.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DomainState {
    pub domain: String,
    /// Last turn a tool of this domain was called or it was explicitly loaded.
    pub last_used_turn: i64,
    /// Stays loaded for the rest of the session (mid-workflow state).
    pub pinned: bool,
    /// Unloaded by the model (`unload_tools`); kept out until used again.
    pub unloaded: bool,
}

/// What the router needs to know about a session for one turn.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SessionView {
    /// The current user turn (1 for the first message); from the persisted message
    /// count, so it survives restarts.
    pub turn: i64,
    /// Per-domain memory of this session.
    pub domains: Vec<DomainState>,
    /// `load_all_for_this_turn` was called: every active tool is sent this turn.
    pub load_all_this_turn: bool,
    /// Tools loaded by name during this turn (`load_tools(["send_email"])`): sent
    /// whatever their domain's ranking says.
    pub loaded_tools: Vec<String>,
    /// Tools the previous turn sent on the message's own evidence: a follow-up with no
    /// evidence of its own (`yes do it`, `push`) sees them again.
    pub carried_tools: Vec<String>,
    /// Tools called in the previous turn and in this one, with the turn each call was
    /// recorded at: the tools that take what they found (`install_app` after
    /// `search_app_store`) are likelier (the `next_step` feature).
    pub recent_calls: Vec<(i64, String)>,
}

/// Why a meta-tool request could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error("no tool or domain named {}", .0.join(", "))]
    UnknownNames(Vec<String>),
    #[error("domain `{0}` is always on and cannot be unloaded")]
    AlwaysOn(String),
}

impl SessionView {
    /// A fresh session at `turn`.
    pub fn new(turn: i64) -> SessionView {
        SessionView {
            turn,
            ..SessionView::default()
        }
    }

    /// A view built from stored state.
    pub fn from_store(turn: i64, domains: Vec<DomainState>) -> SessionView {
        SessionView {
            turn,
            domains,
            ..SessionView::default()
        }
    }

    /// Moves the clock to a new user turn: per-turn loads end, and what `previous`
    /// sent on its message's evidence is carried into this turn.
    pub fn begin_turn(&mut self, turn: i64, previous: Option<&Selection>) {
        // As the server does: carried at the end of the previous turn's routing.
        self.carried_tools = previous
            .map(|previous| self.carry_into_next(previous))
            .unwrap_or_default();
        self.turn = turn;
        self.load_all_this_turn = false;
        self.loaded_tools.clear();
        self.recent_calls.retain(|(at, _)| *at >= turn - 1);
    }

    /// What this turn, routed as `selection`, carries into the next: its likeliest
    /// tools ([`carry_over`]) and the tools carried into this turn that it still sent
    /// and the model did not call last turn (a request the model answered with
    /// questions, or with a login first, stays open until its tool is called, or until
    /// the conversation has moved so far that the router no longer sends it).
    pub fn carry_into_next(&self, selection: &Selection) -> Vec<String> {
        let mut carry = carry_over(selection);
        for name in &self.carried_tools {
            let called = self
                .recent_calls
                .iter()
                .any(|(turn, c)| *turn == self.turn - 1 && c == name);
            if !called && selection.contains(name) && !carry.contains(name) {
                carry.push(name.clone());
            }
        }
        carry
    }

    /// No call was recorded at the turn before this one: the model answered it with
    /// words (a question, most often), and what it carried is still wanted.
    pub fn called_nothing_last_turn(&self) -> bool {
        !self
            .recent_calls
            .iter()
            .any(|(turn, _)| *turn == self.turn - 1)
    }

    pub fn state(&self, domain: &str) -> Option<&DomainState> {
        self.domains.iter().find(|s| s.domain == domain)
    }

    /// Whether a domain is held by the session this turn: pinned, or used within the
    /// last `idle_turns` turns, and not unloaded since.
    pub fn holds(&self, domain: &str, idle_turns: i64) -> Option<Stage> {
        let state = self.state(domain)?;
        if state.unloaded {
            return None;
        }
        if state.pinned {
            return Some(Stage::Pinned);
        }
        (self.turn - state.last_used_turn <= idle_turns).then_some(Stage::Sticky)
    }

    /// Records the tools the model called this turn: their domains count as used now,
    /// and a call to a tool that pins its domain (`pins_domain`, or one of the router's
    /// `pin_on_tools`) pins it for the session.
    /// Returns the rows that changed, for the server to persist.
    pub fn record_calls<S: AsRef<str>>(
        &mut self,
        router: &Router,
        called: &[S],
    ) -> Vec<DomainState> {
        let mut changed: Vec<DomainState> = Vec::new();
        for name in called {
            let name = name.as_ref();
            let Some(tool) = router.registry().tool(name) else {
                continue;
            };
            if !self.recent_calls.iter().any(|(_, c)| c == name) {
                self.recent_calls.push((self.turn, name.to_owned()));
            }
            if router.is_core_domain(&tool.domain) {
                continue;
            }
            let pin = tool.pins_domain || router.config().pin_on_tools.iter().any(|p| p == name);
            let row = self.touch(&tool.domain, pin);
            upsert(&mut changed, row);
        }
        changed
    }

    /// `load_tools`: each name is a domain or a tool. Domains count as used now (so they
    /// stay while in use); tools are also sent this turn whatever the ranking says.
    /// Nothing changes when a name is unknown.
    pub fn load<S: AsRef<str>>(
        &mut self,
        router: &Router,
        names: &[S],
    ) -> Result<Vec<DomainState>, SessionError> {
        let registry = router.registry();
        let unknown: Vec<String> = names
            .iter()
            .map(AsRef::as_ref)
            .filter(|n| registry.domain(n).is_none() && registry.tool(n).is_none())
            .map(str::to_owned)
            .collect();
        if !unknown.is_empty() {
            return Err(SessionError::UnknownNames(unknown));
        }
        let mut changed = Vec::new();
        for name in names.iter().map(AsRef::as_ref) {
            let domain = match (registry.domain(name), registry.tool(name)) {
                (Some(domain), _) => domain.name.clone(),
                (None, Some(tool)) => {
                    if !self.loaded_tools.iter().any(|t| t == name) {
                        self.loaded_tools.push(name.to_owned());
                    }
                    tool.domain.clone()
                }
                (None, None) => continue,
            };
            if router.is_core_domain(&domain) {
                continue;
            }
            let row = self.touch(&domain, false);
            upsert(&mut changed, row);
        }
        Ok(changed)
    }

    /// `unload_tools`: each name is a domain or a tool (meaning its domain). The domain
    /// stays out, pin included, until it is used or loaded again.
    pub fn unload<S: AsRef<str>>(
        &mut self,
        router: &Router,
        names: &[S],
    ) -> Result<Vec<DomainState>, SessionError> {
        let registry = router.registry();
        let mut domains: Vec<String> = Vec::new();
        let mut unknown = Vec::new();
        for name in names.iter().map(AsRef::as_ref) {
            let domain = match (registry.domain(name), registry.tool(name)) {
                (Some(domain), _) => domain.name.clone(),
                (None, Some(tool)) => tool.domain.clone(),
                (None, None) => {
                    unknown.push(name.to_owned());
                    continue;
                }
            };
            if router.is_core_domain(&domain) {
                return Err(SessionError::AlwaysOn(domain));
            }
            if !domains.contains(&domain) {
                domains.push(domain);
            }
        }
        if !unknown.is_empty() {
            return Err(SessionError::UnknownNames(unknown));
        }
        let mut changed = Vec::new();
        for domain in domains {
            self.loaded_tools
                .retain(|t| registry.tool(t).is_none_or(|tool| tool.domain != domain));
            self.carried_tools
                .retain(|t| registry.tool(t).is_none_or(|tool| tool.domain != domain));
            let state = self.state_mut(&domain);
            state.unloaded = true;
            state.pinned = false;
            changed.push(state.clone());
        }
        Ok(changed)
    }

    /// `load_all_for_this_turn`: every active tool is sent until the next turn begins.
    pub fn load_all_for_this_turn(&mut self) {
        self.load_all_this_turn = true;
    }

    fn touch(&mut self, domain: &str, pin: bool) -> DomainState {
        let turn = self.turn;
        let state = self.state_mut(domain);
        state.last_used_turn = turn;
        state.unloaded = false;
        state.pinned |= pin;
        state.clone()
    }

    fn state_mut(&mut self, domain: &str) -> &mut DomainState {
        let idx = match self.domains.iter().position(|s| s.domain == domain) {
            Some(idx) => idx,
            None => {
                self.domains.push(DomainState {
                    domain: domain.to_owned(),
                    // Never used: far enough back that it is not sticky.
                    last_used_turn: i64::MIN / 2,
                    pinned: false,
                    unloaded: false,
                });
                self.domains.len() - 1
            }
        };
        &mut self.domains[idx]
    }
}

/// The tools a selection sent on its message's own evidence, which the next turn
/// carries over.
pub fn carry_over(selection: &Selection) -> Vec<String> {
    // The scorer's likeliest tools: those within half of the turn's best.
    let best_scored = selection
        .tools
        .iter()
        .filter(|t| t.stage == Stage::Scored)
        .map(|t| t.score)
        .fold(0.0f32, f32::max);
    selection
        .tools
        .iter()
        .filter(|t| {
            t.stage == Stage::Keyword || (t.stage == Stage::Scored && t.score >= 0.5 * best_scored)
        })
        .map(|t| t.name.to_string())
        .collect()
}

fn upsert(rows: &mut Vec<DomainState>, row: DomainState) {
    match rows.iter_mut().find(|r| r.domain == row.domain) {
        Some(existing) => *existing = row,
        None => rows.push(row),
    }
}
