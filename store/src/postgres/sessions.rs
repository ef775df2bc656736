//! Sessions on PostgreSQL: their messages, turn count and carry-over list, and the
//! router's per-domain state.

use super::PostgresStore;
use crate::{
    MessageRow, SessionDomainState, StoreError, called_tool, carry_json, new_session_id, now_ms,
    parse_carry, validate_session_id,
};

impl PostgresStore {
    pub async fn session_create(&self) -> Result<String, StoreError> {
        let id = new_session_id();
        self.session_ensure(&id).await?;
        Ok(id)
    }

    pub async fn session_ensure(&self, id: &str) -> Result<(), StoreError> {
        validate_session_id(id)?;
        self.execute(
            "INSERT INTO sessions(id, created_ms) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
            &[&id, &now_ms()],
        )
        .await
        .map(drop)
    }

    pub async fn session_claim(&self, id: &str, client: Option<&str>) -> Result<bool, StoreError> {
        validate_session_id(id)?;
        self.execute(
            "INSERT INTO sessions(id, created_ms, client) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO NOTHING",
            &[&id, &now_ms(), &client],
        )
        .await?;
        let owner: Option<String> = match self
            .query_opt("SELECT client FROM sessions WHERE id = $1", &[&id])
            .await?
        {
            Some(row) => row.try_get(0).map_err(|e| self.error(e))?,
            None => None,
        };
        Ok(client.is_none() || owner.as_deref() == client)
    }

    pub async fn session_exists(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .query_opt("SELECT 1 FROM sessions WHERE id = $1", &[&id])
            .await?
            .is_some())
    }

    pub async fn session_turn(&self, id: &str) -> Result<i64, StoreError> {
        match self
            .query_opt("SELECT n_turns FROM sessions WHERE id = $1", &[&id])
            .await?
        {
            Some(row) => row.try_get(0).map_err(|e| self.error(e)),
            None => Ok(0),
        }
    }

    pub async fn user_message(
        &self,
        session: &str,
        turn: i64,
    ) -> Result<Option<String>, StoreError> {
        match self
            .query_opt(
                "SELECT content FROM messages WHERE session_id = $1 AND turn = $2 AND role = 'user'
                 ORDER BY id LIMIT 1",
                &[&session, &turn],
            )
            .await?
        {
            Some(row) => row.try_get(0).map_err(|e| self.error(e)),
            None => Ok(None),
        }
    }

    pub async fn message_append(
        &self,
        session: &str,
        role: &str,
        content: &serde_json::Value,
        carry: &[String],
    ) -> Result<i64, StoreError> {
        validate_session_id(session)?;
        let called = called_tool(role, content);
        let content = content.to_string();
        let carry = carry_json(carry)?;
        let is_user = role == "user";
        // One statement: creates the session if needed, counts the turn (the row
        // lock orders concurrent appends from several replicas), replaces the
        // carry-over list on a user message, and stores the message.
        let row = self
            .query_one(
                "WITH s AS (
                    INSERT INTO sessions(id, created_ms, n_turns, carry)
                    VALUES ($1, $2, CASE WHEN $3 THEN 1 ELSE 0 END, $6)
                    ON CONFLICT (id) DO UPDATE
                        SET n_turns = sessions.n_turns + CASE WHEN $3 THEN 1 ELSE 0 END,
                            carry = CASE WHEN $3 THEN $6 ELSE sessions.carry END
                    RETURNING n_turns
                 )
                 INSERT INTO messages(session_id, turn, role, content, at_ms, called)
                 SELECT $1, s.n_turns, $4, $5, $2, $7 FROM s
                 RETURNING turn",
                &[
                    &session,
                    &now_ms(),
                    &is_user,
                    &role,
                    &content,
                    &carry,
                    &called,
                ],
            )
            .await?;
        row.try_get(0).map_err(|e| self.error(e))
    }

    pub async fn session_carry_put(
        &self,
        session: &str,
        turn: i64,
        carry: &[String],
    ) -> Result<(), StoreError> {
        let carry = carry_json(carry)?;
        self.execute(
            "UPDATE sessions SET carry = $1 WHERE id = $2 AND n_turns = $3",
            &[&carry, &session, &turn],
        )
        .await?;
        Ok(())
    }

    /// The session's turn count and the latest turn's carry-over list.
    pub async fn session_head(&self, id: &str) -> Result<(i64, Vec<String>), StoreError> {
        match self
            .query_opt("SELECT n_turns, carry FROM sessions WHERE id = $1", &[&id])
            .await?
        {
            Some(row) => {
                let turn: i64 = row.try_get(0).map_err(|e| self.error(e))?;
                let carry: String = row.try_get(1).map_err(|e| self.error(e))?;
                Ok((turn, parse_carry(&carry)))
            }
            None => Ok((0, Vec::new())),
        }
    }

    pub async fn calls_reported(
        &self,
        session: &str,
        turn: i64,
        rows: Vec<(String, String)>,
    ) -> Result<(), StoreError> {
        let (names, contents): (Vec<String>, Vec<String>) = rows.into_iter().unzip();
        // One statement for every row; only a turn the session has reached.
        self.execute(
            "INSERT INTO messages(session_id, turn, role, content, at_ms, called)
             SELECT $1, $2, 'tool', r.content, $3, r.name
             FROM unnest($4::text[], $5::text[]) WITH ORDINALITY AS r(name, content, n)
             WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND n_turns >= $2)
             ORDER BY r.n",
            &[&session, &turn, &now_ms(), &names, &contents],
        )
        .await?;
        Ok(())
    }

    pub async fn sessions_active_since(
        &self,
        since_ms: i64,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        let rows = self
            .query(
                "SELECT session_id FROM messages GROUP BY session_id
                 HAVING MAX(at_ms) >= $1 ORDER BY MAX(at_ms) DESC, session_id LIMIT $2",
                &[&since_ms, &limit],
            )
            .await?;
        rows.iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    pub async fn messages(&self, session: &str) -> Result<Vec<MessageRow>, StoreError> {
        let rows = self
            .query(
                "SELECT turn, role, content, at_ms FROM messages WHERE session_id = $1 ORDER BY id",
                &[&session],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let content: String = r.try_get(2)?;
                Ok(MessageRow {
                    turn: r.try_get(0)?,
                    role: r.try_get(1)?,
                    content: serde_json::from_str(&content)
                        .unwrap_or(serde_json::Value::String(content)),
                    at_ms: r.try_get(3)?,
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    /// The tools the session called with success in its latest turn, oldest first,
    /// with the turn of each call.
    pub async fn latest_turn_calls(&self, session: &str) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = self
            .query(
                "SELECT m.turn, m.called FROM messages m
                 JOIN sessions s ON s.id = m.session_id
                 WHERE m.session_id = $1 AND m.turn >= s.n_turns AND m.called IS NOT NULL
                 ORDER BY m.id",
                &[&session],
            )
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    pub async fn session_domains(
        &self,
        session: &str,
    ) -> Result<Vec<SessionDomainState>, StoreError> {
        let rows = self
            .query(
                "SELECT domain, last_used_turn, pinned, unloaded FROM session_domains
                 WHERE session_id = $1 ORDER BY domain",
                &[&session],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(SessionDomainState {
                    domain: r.try_get(0)?,
                    last_used_turn: r.try_get(1)?,
                    pinned: r.try_get(2)?,
                    unloaded: r.try_get(3)?,
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    pub async fn session_domain_put(
        &self,
        session: &str,
        state: &SessionDomainState,
    ) -> Result<(), StoreError> {
        validate_session_id(session)?;
        self.execute(
            "INSERT INTO session_domains(session_id, domain, last_used_turn, pinned, unloaded)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (session_id, domain) DO UPDATE SET
               last_used_turn = excluded.last_used_turn,
               pinned = excluded.pinned,
               unloaded = excluded.unloaded",
            &[
                &session,
                &state.domain,
                &state.last_used_turn,
                &state.pinned,
                &state.unloaded,
            ],
        )
        .await
        .map(drop)
    }

    pub async fn domain_used(&self, domain: &str, at_ms: i64) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO domain_use(domain, last_used_ms) VALUES ($1, $2)
             ON CONFLICT (domain) DO UPDATE
                SET last_used_ms = GREATEST(domain_use.last_used_ms, excluded.last_used_ms)",
            &[&domain, &at_ms],
        )
        .await
        .map(drop)
    }

    pub async fn domains_used_since_by_recency(
        &self,
        since_ms: i64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = self
            .query(
                "SELECT domain, last_used_ms FROM domain_use WHERE last_used_ms >= $1
                 ORDER BY last_used_ms DESC, domain",
                &[&since_ms],
            )
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    pub async fn domains_used_since(&self, since_ms: i64) -> Result<Vec<String>, StoreError> {
        let rows = self
            .query(
                "SELECT domain FROM domain_use WHERE last_used_ms >= $1 ORDER BY domain",
                &[&since_ms],
            )
            .await?;
        rows.iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(|e| self.error(e))
    }
}
