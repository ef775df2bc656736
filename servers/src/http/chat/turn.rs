//! One chat turn: the model loop.
//!
//! Route the message; then, up to [`MAX_STEPS`] times: send the history, the system
//! prompt (with hints for the active tools not sent) and the selected tools to the
//! model; run the tool calls it asks for through the registry; stop when it answers
//! without tool calls. Every message, tool call and result is persisted as it
//! happens; every selection goes to the decision log through [`Routing`].
//!
//! A call for a tool outside the turn's selection is refused (the tool never runs)
//! with directions to load it first; tool errors go back to the model as tool
//! results. Only the model endpoint failing ends a turn early.

use std::sync::atomic::Ordering;
use std::time::Instant;

use loadout_router::{Selection, Stage};
use loadout_store::Store;
use loadout_store::{AuditRow, now_ms};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::control::TurnControl;
use super::llm::{LlmConfig, LlmError, Reply, ToolCall, cut};
use crate::http::HttpState;
use crate::log_writer::error_kind;

/// Most model steps in one turn; the turn ends with a note when it is reached.
pub const MAX_STEPS: usize = 8;
/// Most stored messages sent back to the model as history.
const MAX_HISTORY_MESSAGES: usize = 60;
/// Most hints listed in the system prompt.
const MAX_PROMPT_HINTS: usize = 40;
/// Longest tool result given to the model, in bytes.
const MAX_RESULT_BYTES: usize = 16 * 1024;

/// Where a turn's step events go: collected for a JSON answer, or sent to an SSE
/// stream as they happen.
pub enum Events {
    Collect(Vec<Value>),
    Stream(mpsc::UnboundedSender<(&'static str, Value)>),
}

impl Events {
    pub fn emit(&mut self, kind: &'static str, data: Value) {
        match self {
            Events::Collect(events) => {
                let mut event = json!({"event": kind});
                if let (Some(event), Value::Object(fields)) = (event.as_object_mut(), data) {
                    event.extend(fields);
                }
                events.push(event);
            }
            // The client may have gone away; the turn still completes and persists.
            Events::Stream(sender) => {
                let _closed = sender.send((kind, data));
            }
        }
    }
}

/// How a turn ended.
#[derive(Debug)]
pub struct TurnOutcome {
    pub answer: String,
    pub n_steps: usize,
    /// The step limit was reached before the model answered.
    pub stopped: bool,
    /// Writes of this turn the store refused (messages, session state): the answer
    /// stands, but the session's history lacks them.
    pub unsaved: usize,
}

/// Everything a turn needs, prepared before any event is sent (so routing errors
/// still get their HTTP status).
pub struct Turn {
    pub state: HttpState,
    /// The client whose token started the turn (`None`: the operator): the model is
    /// sent only its tools, and a call outside them is refused.
    pub client: Option<crate::clients::Client>,
    pub config: LlmConfig,
    pub session: String,
    pub message: String,
    pub control: TurnControl,
    /// Other turns of this session wait until this one ends.
    pub _session_turn: crate::routing::SessionGuard,
    /// See [`TurnOutcome::unsaved`].
    pub unsaved: std::sync::atomic::AtomicUsize,
    /// The selection the message was routed to, before any meta-tool changed it.
    pub first_selection: std::sync::Arc<Selection>,
    /// Tools called with success this turn, in order.
    pub succeeded: std::sync::Mutex<Vec<String>>,
}

impl Turn {
    pub fn turn_number(&self) -> i64 {
        self.control.lock().routed.turn
    }

    /// The audit's client of this turn's calls: the client's name, `chat` for the
    /// operator.
    fn audit_client(&self) -> String {
        match &self.client {
            Some(client) => client.0.name.clone(),
            None => "chat".into(),
        }
    }

    fn unsaved(&self) -> usize {
        self.unsaved.load(Ordering::Relaxed)
    }

    /// Runs the model loop, then queues what the turn teaches the learned memory.
    pub async fn run(self, events: &mut Events) -> Result<TurnOutcome, LlmError> {
        let outcome = self.steps(events).await;
        self.learn();
        outcome
    }

    /// The turn's message teaches the tools it called with success: `repair` for
    /// those the model fetched itself (routing missed them), `chat` for the rest.
    fn learn(&self) {
        let succeeded =
            std::mem::take(&mut *self.succeeded.lock().unwrap_or_else(|p| p.into_inner()));
        if succeeded.is_empty() {
            return;
        }
        let (allowed, routing) = {
            let state = self.control.lock();
            (
                crate::learning::learning_allowed(&state.routed.settings),
                self.state.app.routing(),
            )
        };
        if !allowed {
            return;
        }
        let fetched = self
            .control
            .fetched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let (mut repaired, mut routed) = (Vec::new(), Vec::new());
        for tool in succeeded {
            let list = if fetched.contains(&tool) && !self.first_selection.contains(&tool) {
                &mut repaired
            } else {
                &mut routed
            };
            if !list.contains(&tool) {
                list.push(tool);
            }
        }
        for (tools, source) in [
            (repaired, crate::learning::LearnSource::Repair),
            (routed, crate::learning::LearnSource::Chat),
        ] {
            routing.learner.record(crate::learning::LearnEvent {
                message: crate::learning::LearnText::Message(self.message.clone()),
                tools,
                session: Some(self.session.clone()),
                source,
            });
        }
    }

    async fn steps(&self, events: &mut Events) -> Result<TurnOutcome, LlmError> {
        let store = self.state.app.store().clone();
        // The turn's router's registry: the upstream tools it was routed with.
        let registry = self.control.lock().routed.router.registry().clone();
        let turn = self.turn_number();
        let mut messages = match store.messages(&self.session).await {
            Ok(rows) => history(&rows),
            Err(e) => {
                tracing::warn!("chat history of `{}` not read: {e}", self.session);
                vec![json!({"role": "user", "content": self.message})]
            }
        };
        let ctx = loadout::ToolContext::new(registry.clone(), self.state.app.settings.clone())
            .with_session(self.session.clone())
            .with_client(self.audit_client())
            .with_session_control(std::sync::Arc::new(self.control.clone()));

        let mut show_selection = true;
        for step in 0..MAX_STEPS {
            let (tools, system) = {
                let mut state = self.control.lock();
                state.changed = false;
                let seen;
                let selection = match &self.client {
                    Some(client) => {
                        seen = client.filter(&registry, &state.routed.selection);
                        &seen
                    }
                    None => &state.routed.selection,
                };
                if show_selection {
                    events.emit("selection", selection_event(step, turn, selection));
                }
                (
                    selection.tools_openai(&registry),
                    system_prompt(selection, &registry, self.client.as_ref()),
                )
            };
            let mut request = Vec::with_capacity(messages.len() + 1);
            request.push(json!({"role": "system", "content": system}));
            request.extend(messages.iter().cloned());

            let reply = match self
                .state
                .llm
                .complete(&self.config, &request, &tools)
                .await
            {
                Ok(reply) => reply,
                Err(error) => {
                    let message = error.to_string();
                    // The kind the JSON answer's error carries (`ApiError::BadGateway`).
                    events.emit(
                        "error",
                        json!({"step": step, "kind": "model_error", "message": message}),
                    );
                    // Text, as a user message's content is.
                    self.append(&store, "error", &Value::String(message)).await;
                    return Err(error);
                }
            };
            let assistant = assistant_message(&reply);
            self.append(&store, "assistant", &assistant).await;
            events.emit(
                "assistant",
                json!({"step": step, "content": reply.content, "tool_calls": reply.tool_calls.iter().map(ToolCall::to_openai).collect::<Vec<_>>()}),
            );
            if reply.tool_calls.is_empty() {
                let answer = reply.content.unwrap_or_default();
                let unsaved = self.unsaved();
                events.emit(
                    "final",
                    json!({"turn": turn, "answer": answer, "steps": step + 1, "unsaved": unsaved}),
                );
                return Ok(TurnOutcome {
                    answer,
                    n_steps: step + 1,
                    stopped: false,
                    unsaved,
                });
            }
            messages.push(assistant_for_model(&assistant));

            self.run_calls(step, &reply.tool_calls, &ctx, &store, events, &mut messages)
                .await;
            show_selection = self.control.lock().changed;
        }
        Ok(self.stop_at_step_limit(&store, events, turn).await)
    }

    /// Runs the tool calls of one model step, in order: each is stored, shown, and
    /// answered to the model in `messages`.
    async fn run_calls(
        &self,
        step: usize,
        calls: &[ToolCall],
        ctx: &loadout::ToolContext,
        store: &Store,
        events: &mut Events,
        messages: &mut Vec<Value>,
    ) {
        for call in calls {
            events.emit(
                "tool_call",
                json!({"step": step, "id": call.id, "name": call.name, "arguments": call.arguments}),
            );
            let result = self.execute(call, ctx.clone()).await;
            let stored = json!({
                "tool_call_id": call.id,
                "name": call.name,
                "ok": result.ok,
                "refused": result.refused,
                "content": result.content,
            });
            self.append(store, "tool", &stored).await;
            events.emit(
                "tool_result",
                json!({"step": step, "id": call.id, "name": call.name, "ok": result.ok, "refused": result.refused, "content": result.content}),
            );
            messages
                .push(json!({"role": "tool", "tool_call_id": call.id, "content": result.content}));
        }
    }

    /// The turn's end when the model kept calling tools for [`MAX_STEPS`] steps.
    async fn stop_at_step_limit(
        &self,
        store: &Store,
        events: &mut Events,
        turn: i64,
    ) -> TurnOutcome {
        let answer = format!(
            "I stopped after {MAX_STEPS} steps without a final answer; ask me to continue if you want more."
        );
        self.append(
            store,
            "assistant",
            &json!({"content": answer, "tool_calls": [], "stopped": "step_limit"}),
        )
        .await;
        let unsaved = self.unsaved();
        events.emit(
            "final",
            json!({"turn": turn, "answer": answer, "steps": MAX_STEPS, "stopped": "step_limit", "unsaved": unsaved}),
        );
        TurnOutcome {
            answer,
            n_steps: MAX_STEPS,
            stopped: true,
            unsaved,
        }
    }

    /// Runs one tool call if the turn's selection holds the tool; the result is what
    /// the model reads.
    async fn execute(&self, call: &ToolCall, ctx: loadout::ToolContext) -> CallResult {
        use tracing::Instrument as _;
        let span = crate::telemetry::tool_span(&call.name);
        let (result, outcome) = self
            .execute_untraced(call, ctx)
            .instrument(span.clone())
            .await;
        crate::telemetry::end_tool_span(&span, &outcome);
        result
    }

    /// [`Turn::execute`]'s work: the result, and the audit's outcome.
    async fn execute_untraced(
        &self,
        call: &ToolCall,
        ctx: loadout::ToolContext,
    ) -> (CallResult, String) {
        let started = Instant::now();
        let (registry, sent) = {
            let state = self.control.lock();
            let routed = &state.routed;
            (
                routed.router.registry().clone(),
                routed.selection.contains(&call.name),
            )
        };
        let args: Result<Value, String> = if call.arguments.trim().is_empty() {
            Ok(json!({}))
        } else {
            serde_json::from_str(&call.arguments).map_err(|e| e.to_string())
        };
        let (result, outcome) = if let Some(refused) = self.refusal(&registry, call, sent) {
            refused
        } else {
            match args {
                Err(e) => {
                    let message = format!("invalid arguments: not JSON ({e}); send a JSON object");
                    (
                        CallResult::error(message.clone()),
                        ("invalid_args".to_owned(), Some(message)),
                    )
                }
                Ok(args) => match registry.call(&call.name, args, ctx).await {
                    Ok(value) => {
                        self.record_call(&call.name).await;
                        if !loadout::meta::ALL.contains(&call.name.as_str()) {
                            self.succeeded
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(call.name.clone());
                        }
                        (CallResult::ok(&value), ("ok".to_owned(), None))
                    }
                    Err(error) => {
                        let message = error.to_string();
                        (
                            CallResult::error(format!("error: {message}")),
                            (error_kind(&error), Some(message)),
                        )
                    }
                },
            }
        };
        self.state
            .audit
            .record_for(
                self.client.as_ref(),
                AuditRow {
                    at_ms: now_ms(),
                    client: self.audit_client(),
                    tool: cut(&call.name, 128),
                    args: audit_args(&call.arguments),
                    outcome: outcome.0.clone(),
                    detail: outcome.1,
                    duration_ms: started.elapsed().as_secs_f64() * 1000.0,
                },
            )
            .await;
        (result, outcome.0)
    }

    /// A call the turn refuses before it runs, with the audit's outcome: a tool
    /// outside the client's set, or not sent this turn (or no tool at all).
    fn refusal(
        &self,
        registry: &loadout::Registry,
        call: &ToolCall,
        sent: bool,
    ) -> Option<(CallResult, (String, Option<String>))> {
        let outside = self.client.as_ref().filter(|client| {
            registry.tool(&call.name).is_some() && !client.may_use(registry, &call.name)
        });
        if let Some(client) = outside {
            let message = format!(
                "refused: tool `{}` is not among the tools of client `{}`, so it did not run.",
                call.name, client.0.name
            );
            Some((
                CallResult::refused(message.clone()),
                ("refused".to_owned(), Some(message)),
            ))
        } else if !sent {
            // A name no tool has is audited as the registry would (`unknown_tool`).
            let (message, kind) = if registry.tool(&call.name).is_some() {
                (
                    format!(
                        "refused: tool `{name}` is not loaded this turn, so it did not run. Call load_tools with [\"{name}\"] first, then call it again.",
                        name = call.name
                    ),
                    "refused",
                )
            } else {
                (
                    format!(
                        "refused: there is no tool named `{}`; search_tools finds tools by what they do.",
                        cut(&call.name, 64)
                    ),
                    "unknown_tool",
                )
            };
            Some((
                CallResult::refused(message.clone()),
                (kind.to_owned(), Some(message)),
            ))
        } else {
            None
        }
    }

    /// The session's stickiness: the tool's domain counts as used this turn. A call to
    /// a finder routes again when its next steps are not sent yet, so the model's
    /// next step sees them (`install_app` after `search_app_store`).
    async fn record_call(&self, tool: &str) {
        let (changed, carry) = {
            let mut state = self.control.lock();
            let routing = self.state.app.routing();
            let router = state.routed.router.clone();
            let changed = state.routed.view.record_calls(&router, &[tool]);
            let selection = &state.routed.selection;
            let mut carry = None;
            if router
                .next_steps(tool)
                .any(|next| !selection.contains(next))
            {
                routing.reselect(&mut state.routed, Some(&self.session), &self.message);
                state.changed = true;
                carry = Some((state.routed.turn, state.routed.carry.clone()));
            }
            (changed, carry)
        };
        if let Err(e) = self
            .state
            .app
            .routing()
            .persist(
                self.state.app.store(),
                &self.session,
                &changed,
                carry
                    .as_ref()
                    .map(|(turn, carry)| (*turn, carry.as_slice())),
            )
            .await
        {
            tracing::warn!("session state of `{}` not saved: {e}", self.session);
            self.unsaved.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn append(&self, store: &Store, role: &str, content: &Value) {
        if let Err(e) = store.message_append(&self.session, role, content).await {
            tracing::warn!("{role} message of `{}` not saved: {e}", self.session);
            self.unsaved.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A tool call's result as the model reads it.
struct CallResult {
    ok: bool,
    refused: bool,
    content: String,
}

impl CallResult {
    fn ok(value: &Value) -> CallResult {
        let text = match value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let content = if text.len() > MAX_RESULT_BYTES {
            format!(
                "{} [result cut at {MAX_RESULT_BYTES} bytes of {}]",
                cut(&text, MAX_RESULT_BYTES),
                text.len()
            )
        } else {
            text
        };
        CallResult {
            ok: true,
            refused: false,
            content,
        }
    }

    fn error(message: String) -> CallResult {
        CallResult {
            ok: false,
            refused: false,
            content: message,
        }
    }

    fn refused(message: String) -> CallResult {
        CallResult {
            ok: false,
            refused: true,
            content: message,
        }
    }
}

/// The system prompt of one step: what the tool list is, and how to reach the rest
/// (hints for the active tools of considered domains, then the other active domains).
pub fn system_prompt(
    selection: &Selection,
    registry: &loadout::Registry,
    client: Option<&crate::clients::Client>,
) -> String {
    let mut prompt = String::from(
        "You are a helpful assistant. Use the tools in your tool list when they help; answer directly when none is needed.\n",
    );
    let other_domains: Vec<&loadout_router::DomainDecision> = selection
        .domains
        .iter()
        .filter(|d| !d.included && d.stage != Stage::Inactive)
        .filter(|d| client.is_none_or(|c| c.may_see_domain(registry, &d.domain)))
        .collect();
    if !selection.unconfigured.is_empty() {
        prompt.push_str("Domains that fit this message but are not configured (tell the user what each needs and where it is set):\n");
        for unconfigured in &selection.unconfigured {
            prompt.push_str(&format!(
                "- {unconfigured}: {}\n",
                loadout::where_to_set(&unconfigured.missing_settings)
            ));
        }
    }
    if selection.hints.is_empty() && other_domains.is_empty() {
        prompt.push_str("Every active tool is in your tool list.\n");
        return prompt;
    }
    prompt.push_str("Only the tools this message seems to need were sent.\n");
    if !selection.hints.is_empty() {
        prompt.push_str("Active tools not sent (name (domain): what it does):\n");
        for hint in selection.hints.iter().take(MAX_PROMPT_HINTS) {
            prompt.push_str(&format!(
                "- {} ({}): {}\n",
                hint.name, hint.domain, hint.hint
            ));
        }
        if selection.hints.len() > MAX_PROMPT_HINTS {
            prompt.push_str(&format!(
                "- … and {} more; search_tools finds them.\n",
                selection.hints.len() - MAX_PROMPT_HINTS
            ));
        }
    }
    if !other_domains.is_empty() {
        prompt.push_str("Active domains not sent (domain: what it covers):\n");
        for decision in other_domains {
            let description = registry
                .domain(&decision.domain)
                .map(|d| first_sentence(&d.description))
                .unwrap_or_default();
            prompt.push_str(&format!("- {}: {}\n", decision.domain, description));
        }
    }
    prompt.push_str(
        "To use one of these tools, first call load_tools with its name or its domain; it is callable right after. search_tools finds tools by what they do. Never call a tool that is not in your tool list: such a call is refused.\n",
    );
    prompt
}

/// Up to the first `. `, at most 160 bytes.
fn first_sentence(text: &str) -> String {
    let sentence = text.split_once(". ").map_or(text, |(first, _)| first);
    cut(sentence.trim_end_matches('.'), 160)
}

/// The `selection` event: what was sent and why, per domain.
pub fn selection_event(step: usize, turn: i64, selection: &Selection) -> Value {
    let domains: Vec<Value> = selection
        .domains
        .iter()
        .filter(|d| {
            d.stage != Stage::Inactive
                || d.included
                || selection.unconfigured.iter().any(|u| u.domain == d.domain)
        })
        .map(|d| json!({"domain": d.domain, "included": d.included, "stage": d.stage, "score": d.score, "reason": d.reason}))
        .collect();
    json!({
        "step": step,
        "turn": turn,
        "summary": selection.summary_line(),
        "tools": selection.tool_names().collect::<Vec<_>>(),
        "n_tools": selection.n_tools,
        "n_active_tools": selection.n_active_tools,
        "tokens": selection.tokens,
        "hint_tokens": selection.hint_tokens,
        "all_tools_tokens": selection.all_tools_tokens,
        "n_hints": selection.hints.len(),
        "domains": domains,
        "unconfigured": selection.unconfigured,
    })
}

/// The stored form of an assistant message.
fn assistant_message(reply: &Reply) -> Value {
    json!({
        "content": reply.content,
        "tool_calls": reply.tool_calls.iter().map(ToolCall::to_openai).collect::<Vec<_>>(),
    })
}

fn assistant_for_model(stored: &Value) -> Value {
    let mut message = json!({"role": "assistant", "content": stored.get("content").cloned().unwrap_or(Value::Null)});
    if let Some(calls) = stored
        .get("tool_calls")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
    {
        message["tool_calls"] = json!(calls);
    }
    message
}

/// The session's stored messages as chat-completion messages: the newest
/// [`MAX_HISTORY_MESSAGES`], starting at a user message; tool calls without a stored
/// result (a turn cut short) and results without their call are left out, since
/// chat-completion servers refuse both.
pub fn history(rows: &[loadout_store::MessageRow]) -> Vec<Value> {
    let start = rows.len().saturating_sub(MAX_HISTORY_MESSAGES);
    let start = rows[start..]
        .iter()
        .position(|r| r.role == "user")
        .map_or(rows.len(), |i| start + i);
    let rows = &rows[start..];
    let answered: std::collections::HashSet<&str> = rows
        .iter()
        .filter(|r| r.role == "tool")
        .filter_map(|r| r.content.get("tool_call_id").and_then(Value::as_str))
        .collect();
    let mut called: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut messages = Vec::with_capacity(rows.len());
    for row in rows {
        match row.role.as_str() {
            "user" => {
                let content = match &row.content {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                messages.push(json!({"role": "user", "content": content}));
            }
            "assistant" => {
                let mut stored = row.content.clone();
                if let Some(calls) = stored.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    calls.retain(|c| {
                        c.get("id")
                            .and_then(Value::as_str)
                            .is_some_and(|id| answered.contains(id))
                    });
                    for call in calls.iter() {
                        if let Some(id) = call.get("id").and_then(Value::as_str) {
                            called.insert(id.to_owned());
                        }
                    }
                }
                let message = assistant_for_model(&stored);
                if message["content"].is_null() && message.get("tool_calls").is_none() {
                    continue;
                }
                messages.push(message);
            }
            "tool" => {
                let Some(id) = row.content.get("tool_call_id").and_then(Value::as_str) else {
                    continue;
                };
                if !called.contains(id) {
                    continue;
                }
                let content = row
                    .content
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            // `error` rows are for the history view, not for the model.
            _ => {}
        }
    }
    messages
}

/// Arguments as the audit log keeps them; text that is not JSON is kept as a string.
fn audit_args(arguments: &str) -> Value {
    let value =
        serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_owned()));
    crate::log_writer::audit_args(&value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadout_store::MessageRow;

    fn row(role: &str, content: Value) -> MessageRow {
        MessageRow {
            turn: 1,
            role: role.into(),
            content,
            at_ms: 0,
        }
    }

    /// Issue 40: the prompt tells the model where an unconfigured domain's key is
    /// set; `filesystem_roots` is the operator's, so not with `set_setting`.
    #[test]
    fn the_prompt_says_where_an_unconfigured_domains_keys_are_set() {
        let registry = std::sync::Arc::new(loadout_domains::registry().expect("registry"));
        let router = loadout_router::Router::new(registry.clone(), Default::default());
        let selection = router.select(&loadout_router::RouteInput::new(
            "read the file notes.txt from my documents folder",
            &Default::default(),
            &loadout_router::SessionView::new(1),
        ));
        let prompt = system_prompt(&selection, &registry, None);
        assert!(
            prompt.contains(
                "- filesystem (not configured: set filesystem_roots): the operator sets filesystem_roots from the dashboard or `loadout settings set` (`set_setting` may not)"
            ),
            "{prompt}"
        );
        assert!(!prompt.contains("stored with set_setting"), "{prompt}");
    }

    #[test]
    fn history_drops_unanswered_calls_and_orphan_results() {
        let rows = [
            row("tool", json!({"tool_call_id": "orphan", "content": "x"})),
            row("user", json!("hi")),
            row(
                "assistant",
                json!({"content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "calculate", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "calculate", "arguments": "{}"}}]}),
            ),
            row("tool", json!({"tool_call_id": "a", "content": "2"})),
            row("error", json!("model down")),
            row("assistant", json!({"content": "two", "tool_calls": []})),
        ];
        let messages = history(&rows);
        assert_eq!(messages.len(), 4, "{messages:?}");
        assert_eq!(messages[0]["role"], "user");
        assert_eq!(messages[1]["tool_calls"].as_array().map(Vec::len), Some(1));
        assert_eq!(messages[2]["tool_call_id"], "a");
        assert_eq!(messages[3], json!({"role": "assistant", "content": "two"}));
    }
}
