//! Sessions on SQLite: their messages, turn count and carry-over list, and the
//! router's per-domain state.

use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use crate::{
    MessageRow, SessionDomainState, SessionSnapshot, StoreError, called_tool, carry_json,
    new_session_id, now_ms, parse_carry, validate_session_id,
};

impl SqliteStore {
    pub async fn session_create(&self) -> Result<String, StoreError> {
        let id = new_session_id();
        self.session_ensure(&id).await?;
        Ok(id)
    }

    pub async fn session_ensure(&self, id: &str) -> Result<(), StoreError> {
        validate_session_id(id)?;
        let id = id.to_owned();
        self.call(move |c| {
            c.prepare_cached("INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)")?
                .execute(params![id, now_ms()])?;
            Ok(())
        })
        .await
    }

    pub async fn session_claim(&self, id: &str, client: Option<&str>) -> Result<bool, StoreError> {
        validate_session_id(id)?;
        let (id, client) = (id.to_owned(), client.map(str::to_owned));
        self.call(move |c| {
            c.prepare_cached(
                "INSERT OR IGNORE INTO sessions(id, created_ms, client) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![id, now_ms(), client])?;
            let owner: Option<String> = c
                .prepare_cached("SELECT client FROM sessions WHERE id = ?1")?
                .query_row([&id], |row| row.get(0))?;
            Ok(client.is_none() || owner == client)
        })
        .await
    }

    pub async fn session_exists(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.call(move |c| {
            Ok(c.prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")?
                .query_row([id], |_| Ok(()))
                .optional()?
                .is_some())
        })
        .await
    }

    pub async fn session_carry_put(
        &self,
        session: &str,
        turn: i64,
        carry: &[String],
    ) -> Result<(), StoreError> {
        let (session, carry) = (session.to_owned(), carry_json(carry)?);
        self.call(move |c| {
            c.prepare_cached("UPDATE sessions SET carry = ?1 WHERE id = ?2 AND n_turns = ?3")?
                .execute(params![carry, session, turn])?;
            Ok(())
        })
        .await
    }

    pub async fn session_turn(&self, id: &str) -> Result<i64, StoreError> {
        let id = id.to_owned();
        self.call(move |c| Ok(read_session_turn(c, &id)?)).await
    }

    pub async fn message_append(
        &self,
        session: &str,
        role: &str,
        content: &serde_json::Value,
        carry: &[String],
    ) -> Result<i64, StoreError> {
        validate_session_id(session)?;
        let called = called_tool(role, content).map(str::to_owned);
        let (session, role, content) = (session.to_owned(), role.to_owned(), content.to_string());
        let carry = carry_json(carry)?;
        self.call(move |c| {
            let tx = c.transaction()?;
            // One statement creates the session or counts the turn (a user message
            // also replaces the carry-over list), and returns the count; statements
            // are cached (this runs on every routed session turn).
            let added = i64::from(role == "user");
            let turn: i64 = tx
                .prepare_cached(
                    "INSERT INTO sessions(id, created_ms, n_turns, carry) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT(id) DO UPDATE SET n_turns = n_turns + excluded.n_turns,
                         carry = CASE WHEN excluded.n_turns > 0 THEN excluded.carry ELSE carry END
                     RETURNING n_turns",
                )?
                .query_row(params![session, now_ms(), added, carry], |r| r.get(0))?;
            tx.prepare_cached(
                "INSERT INTO messages(session_id, turn, role, content, at_ms, called)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![session, turn, role, content, now_ms(), called])?;
            tx.commit()?;
            Ok(turn)
        })
        .await
    }

    pub async fn user_message(
        &self,
        session: &str,
        turn: i64,
    ) -> Result<Option<String>, StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            Ok(c.prepare_cached(
                "SELECT content FROM messages WHERE session_id = ?1 AND turn = ?2 AND role = 'user'
                 ORDER BY id LIMIT 1",
            )?
            .query_row(params![session, turn], |r| r.get(0))
            .optional()?)
        })
        .await
    }

    pub async fn calls_reported(
        &self,
        session: &str,
        turn: i64,
        rows: Vec<(String, String)>,
    ) -> Result<(), StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            let tx = c.transaction()?;
            {
                // Only a turn the session has reached: the count is the latest turn.
                let mut insert = tx.prepare_cached(
                    "INSERT INTO messages(session_id, turn, role, content, at_ms, called)
                     SELECT ?1, ?2, 'tool', ?3, ?4, ?5
                     WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1 AND n_turns >= ?2)",
                )?;
                for (name, content) in &rows {
                    insert.execute(params![session, turn, content, now_ms(), name])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn sessions_active_since(
        &self,
        since_ms: i64,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        self.call(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT session_id FROM messages GROUP BY session_id
                 HAVING MAX(at_ms) >= ?1 ORDER BY MAX(at_ms) DESC, session_id LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![since_ms, limit], |r| r.get(0))?;
            Ok(rows.collect::<Result<Vec<String>, _>>()?)
        })
        .await
    }

    pub async fn messages(&self, session: &str) -> Result<Vec<MessageRow>, StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT turn, role, content, at_ms FROM messages WHERE session_id = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map([session], |r| {
                let content: String = r.get(2)?;
                Ok(MessageRow {
                    turn: r.get(0)?,
                    role: r.get(1)?,
                    content: serde_json::from_str(&content)
                        .unwrap_or(serde_json::Value::String(content)),
                    at_ms: r.get(3)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    pub async fn session_snapshot(&self, session: &str) -> Result<SessionSnapshot, StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            // One read transaction: the three reads see the same commit.
            let tx = c.transaction()?;
            let (turn, carry) = read_session_head(&tx, &session)?;
            let snapshot = SessionSnapshot {
                turn,
                carry,
                domains: read_session_domains(&tx, &session)?,
                recent_calls: read_calls_since(&tx, &session, turn)?,
            };
            tx.commit()?;
            Ok(snapshot)
        })
        .await
    }

    pub async fn session_domains(
        &self,
        session: &str,
    ) -> Result<Vec<SessionDomainState>, StoreError> {
        let session = session.to_owned();
        self.call(move |c| Ok(read_session_domains(c, &session)?))
            .await
    }

    pub async fn session_domain_put(
        &self,
        session: &str,
        state: &SessionDomainState,
    ) -> Result<(), StoreError> {
        validate_session_id(session)?;
        let (session, state) = (session.to_owned(), state.clone());
        self.call(move |c| {
            c.prepare_cached(
                "INSERT INTO session_domains(session_id, domain, last_used_turn, pinned, unloaded)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(session_id, domain) DO UPDATE SET
                   last_used_turn = excluded.last_used_turn,
                   pinned = excluded.pinned,
                   unloaded = excluded.unloaded",
            )?
            .execute(params![
                session,
                state.domain,
                state.last_used_turn,
                state.pinned,
                state.unloaded
            ])?;
            Ok(())
        })
        .await
    }

    pub async fn domain_used(&self, domain: &str, at_ms: i64) -> Result<(), StoreError> {
        let domain = domain.to_owned();
        self.call(move |c| {
            c.prepare_cached(
                "INSERT INTO domain_use(domain, last_used_ms) VALUES (?1, ?2)
                 ON CONFLICT(domain) DO UPDATE SET last_used_ms = max(last_used_ms, excluded.last_used_ms)",
            )?
            .execute(params![domain, at_ms])?;
            Ok(())
        })
        .await
    }

    pub async fn domains_used_since(&self, since_ms: i64) -> Result<Vec<String>, StoreError> {
        self.call(move |c| Ok(read_domains_used_since(c, since_ms)?))
            .await
    }

    pub async fn domains_used_since_by_recency(
        &self,
        since_ms: i64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        self.call(move |c| {
            let mut stmt = c.prepare_cached(DOMAINS_BY_RECENCY_SQL)?;
            let rows = stmt.query_map([since_ms], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await
    }
}

/// User turns of a session so far (0 for one that does not exist yet).
fn read_session_turn(c: &Connection, session: &str) -> rusqlite::Result<i64> {
    Ok(
        c.prepare_cached("SELECT n_turns FROM sessions WHERE id = ?1")?
            .query_row([session], |r| r.get(0))
            .optional()?
            .unwrap_or(0),
    )
}

const DOMAINS_BY_RECENCY_SQL: &str = "SELECT domain, last_used_ms FROM domain_use
     WHERE last_used_ms >= ?1 ORDER BY last_used_ms DESC, domain";
const SESSION_HEAD_SQL: &str = "SELECT n_turns, carry FROM sessions WHERE id = ?1";
const CALLS_SINCE_SQL: &str = "SELECT turn, called FROM messages
     WHERE session_id = ?1 AND turn >= ?2 AND called IS NOT NULL
     ORDER BY id";
const SESSION_DOMAINS_SQL: &str = "SELECT domain, last_used_turn, pinned, unloaded
     FROM session_domains WHERE session_id = ?1 ORDER BY domain";

/// The session's turn count and the latest turn's carry-over list.
fn read_session_head(c: &Connection, session: &str) -> rusqlite::Result<(i64, Vec<String>)> {
    let head: Option<(i64, String)> = c
        .prepare_cached(SESSION_HEAD_SQL)?
        .query_row([session], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(head.map_or((0, Vec::new()), |(turn, carry)| (turn, parse_carry(&carry))))
}

/// The tools a session called with success from `turn` on, oldest first, with the
/// turn of each call.
fn read_calls_since(
    c: &Connection,
    session: &str,
    turn: i64,
) -> rusqlite::Result<Vec<(i64, String)>> {
    let mut stmt = c.prepare_cached(CALLS_SINCE_SQL)?;
    let rows = stmt.query_map(params![session, turn], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

fn read_session_domains(
    c: &Connection,
    session: &str,
) -> rusqlite::Result<Vec<SessionDomainState>> {
    let mut stmt = c.prepare_cached(SESSION_DOMAINS_SQL)?;
    let rows = stmt.query_map([session], |r| {
        Ok(SessionDomainState {
            domain: r.get(0)?,
            last_used_turn: r.get(1)?,
            pinned: r.get(2)?,
            unloaded: r.get(3)?,
        })
    })?;
    rows.collect()
}

fn read_domains_used_since(c: &Connection, since_ms: i64) -> rusqlite::Result<Vec<String>> {
    let mut stmt =
        c.prepare_cached("SELECT domain FROM domain_use WHERE last_used_ms >= ?1 ORDER BY domain")?;
    let rows = stmt.query_map([since_ms], |r| r.get(0))?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statements of a routed session turn stay compiled from one turn to the
    /// next, whatever session they are bound to (see `configure`).
    #[tokio::test]
    async fn a_session_turns_statements_are_not_compiled_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("loadout.db"))
            .await
            .expect("store");
        for i in 0..5 {
            let session = format!("session-{i}");
            let state = SessionDomainState {
                domain: "weather".into(),
                last_used_turn: 1,
                pinned: false,
                unloaded: false,
            };
            store
                .session_domain_put(&session, &state)
                .await
                .expect("domain");
            store
                .message_append(&session, "user", &serde_json::json!("hello"), &[])
                .await
                .expect("turn");
            store.session_snapshot(&session).await.expect("snapshot");
        }
        let (runs, recompiled) = store
            .call(|c| {
                let mut runs = 0;
                let mut recompiled = 0;
                for sql in [SESSION_DOMAINS_SQL, CALLS_SINCE_SQL, SESSION_HEAD_SQL] {
                    let statement = c.prepare_cached(sql)?;
                    runs += statement.get_status(rusqlite::StatementStatus::Run);
                    recompiled += statement.get_status(rusqlite::StatementStatus::RePrepare);
                }
                Ok((runs, recompiled))
            })
            .await
            .expect("status");
        assert_eq!(runs, 15, "the snapshot's three reads ran once per turn");
        assert_eq!(recompiled, 0);
    }
}
