//! The stages that send tools by rule: loaded by name, and carried over from the
//! last turn.

use super::*;

impl Pass<'_> {
    /// Tools loaded by name (`load_tools`) always go.
    pub(crate) fn loaded_tools(&mut self) {
        let router = self.router;
        for name in &self.input.session.loaded_tools {
            if let Some(t) = router.registry.tool_idx(name)
                && self.evidence.active[router.names.tool_domains[t]]
            {
                self.send(t, Stage::Loaded);
                let d = router.names.tool_domains[t];
                if !self.verdicts[d].included() {
                    self.verdicts[d] = DomainVerdict::ranked(
                        Stage::Loaded,
                        self.verdicts[d].score,
                        Cow::Borrowed("tool loaded by name this turn"),
                    );
                }
            }
        }
    }

    /// A follow-up with no evidence of its own (`yes do it`) sees what the last turn
    /// sent on its message's evidence.
    pub(crate) fn carry_over(&mut self) {
        if self.chit_chat {
            self.notes.push("chit-chat: core only".to_owned());
        }
        if !self.router.config.carry_over || self.evidence_found || self.chit_chat {
            return;
        }
        let router = self.router;
        for name in &self.input.session.carried_tools {
            let Some(t) = router.registry.tool_idx(name) else {
                continue;
            };
            let d = router.names.tool_domains[t];
            if !self.evidence.active[d]
                || self.verdicts[d].stage == Stage::Unloaded
                || self.sent.has(t)
            {
                continue;
            }
            self.send(t, Stage::Carried);
            if !self.verdicts[d].included() {
                self.verdicts[d] = DomainVerdict::ranked(
                    Stage::Carried,
                    self.verdicts[d].score,
                    Cow::Borrowed("sent last turn; this message has no evidence of its own"),
                );
            }
        }
    }
}
