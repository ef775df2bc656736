//! Memory on SQLite: a table in the shared database plus an external-content FTS5
//! index kept in step by triggers; `recall` ranks with `bm25()`.

use loadout::engine::memory::{
    Forgotten, Memory, MemoryEngine, MemoryPage, RecalledMemory, Remembered, not_found, query_terms,
};
use loadout::{BoxFuture, ToolError};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{Error, SqliteStore};

/// Created on first use; every statement is idempotent.
const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS memory_items (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    content TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE VIRTUAL TABLE IF NOT EXISTS memory_fts USING fts5(
    content, tags,
    content = 'memory_items', content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS memory_items_ai AFTER INSERT ON memory_items BEGIN
    INSERT INTO memory_fts(rowid, content, tags) VALUES (new.id, new.content, new.tags);
END;
CREATE TRIGGER IF NOT EXISTS memory_items_ad AFTER DELETE ON memory_items BEGIN
    INSERT INTO memory_fts(memory_fts, rowid, content, tags)
        VALUES ('delete', old.id, old.content, old.tags);
END;
CREATE TRIGGER IF NOT EXISTS memory_items_au AFTER UPDATE ON memory_items BEGIN
    INSERT INTO memory_fts(memory_fts, rowid, content, tags)
        VALUES ('delete', old.id, old.content, old.tags);
    INSERT INTO memory_fts(rowid, content, tags) VALUES (new.id, new.content, new.tags);
END;
"#;

/// Columns every query selects, in the order [`memory_from_row`] reads them.
const COLUMNS: &str = "m.id, m.content, m.tags,
    strftime('%Y-%m-%dT%H:%M:%SZ', m.created_ms / 1000, 'unixepoch'),
    strftime('%Y-%m-%dT%H:%M:%SZ', m.updated_ms / 1000, 'unixepoch')";

/// Tag filter on `m.tags`, a JSON array; `?` is the tag or NULL for no filter.
const TAG_FILTER: &str =
    "(?{n} IS NULL OR EXISTS (SELECT 1 FROM json_each(m.tags) WHERE json_each.value = ?{n}))";

fn tag_filter(n: usize) -> String {
    TAG_FILTER.replace("{n}", &n.to_string())
}

fn ensure_schema(conn: &Connection) -> Result<(), Error> {
    conn.execute_batch(SCHEMA)?;
    Ok(())
}

fn memory_from_row(row: &Row<'_>) -> rusqlite::Result<Memory> {
    let tags: String = row.get(2)?;
    Ok(Memory {
        id: row.get(0)?,
        content: row.get(1)?,
        tags: serde_json::from_str(&tags).unwrap_or_default(),
        created: row.get(3)?,
        updated: row.get(4)?,
    })
}

fn fetch(conn: &Connection, id: i64) -> Result<Option<Memory>, Error> {
    Ok(conn
        .query_row(
            &format!("SELECT {COLUMNS} FROM memory_items m WHERE m.id = ?1"),
            [id],
            memory_from_row,
        )
        .optional()?)
}

fn tags_json(tags: &[String]) -> String {
    serde_json::Value::from(tags.to_vec()).to_string()
}

async fn remember(
    store: &SqliteStore,
    content: String,
    tags: Vec<String>,
) -> Result<Remembered, ToolError> {
    let remembered = store
        .call(move |conn| {
            ensure_schema(conn)?;
            let tx = conn.transaction()?;
            let existing: Option<i64> = tx
                .query_row(
                    "SELECT id FROM memory_items WHERE content = ?1 ORDER BY id LIMIT 1",
                    [&content],
                    |r| r.get(0),
                )
                .optional()?;
            let (id, duplicate) = match existing {
                Some(id) => (id, true),
                None => {
                    let now = crate::now_ms();
                    tx.execute(
                        "INSERT INTO memory_items(content, tags, created_ms, updated_ms)
                         VALUES (?1, ?2, ?3, ?3)",
                        params![content, tags_json(&tags), now],
                    )?;
                    (tx.last_insert_rowid(), false)
                }
            };
            let memory = fetch(&tx, id)?;
            tx.commit()?;
            Ok(memory.map(|memory| Remembered { memory, duplicate }))
        })
        .await?;
    remembered.ok_or_else(|| ToolError::execution("the memory vanished while it was written"))
}

async fn recall(
    store: &SqliteStore,
    match_expr: String,
    tag: Option<String>,
    limit: u32,
) -> Result<Vec<RecalledMemory>, ToolError> {
    Ok(store
        .call(move |conn| {
            ensure_schema(conn)?;
            // Tags weigh twice the text: they are labels the model chose on purpose.
            let sql = format!(
                "SELECT {COLUMNS}, bm25(memory_fts, 1.0, 2.0) AS rank
                 FROM memory_fts JOIN memory_items m ON m.id = memory_fts.rowid
                 WHERE memory_fts MATCH ?1 AND {}
                 ORDER BY rank, m.id DESC LIMIT ?3",
                tag_filter(2)
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params![match_expr, tag, limit], |row| {
                let rank: f64 = row.get(5)?;
                Ok(RecalledMemory {
                    memory: memory_from_row(row)?,
                    // bm25() is lower for better matches; report higher-is-better.
                    score: -rank,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await?)
}

async fn update(
    store: &SqliteStore,
    id: i64,
    content: Option<String>,
    tags: Option<Vec<String>>,
) -> Result<Memory, ToolError> {
    let updated = store
        .call(move |conn| {
            ensure_schema(conn)?;
            let tx = conn.transaction()?;
            let n_changed = tx.execute(
                "UPDATE memory_items SET
                    content = COALESCE(?2, content),
                    tags = COALESCE(?3, tags),
                    updated_ms = ?4
                 WHERE id = ?1",
                params![id, content, tags.as_deref().map(tags_json), crate::now_ms()],
            )?;
            let memory = if n_changed == 0 {
                None
            } else {
                fetch(&tx, id)?
            };
            tx.commit()?;
            Ok(memory)
        })
        .await?;
    updated.ok_or_else(|| not_found(id))
}

async fn forget(store: &SqliteStore, id: i64) -> Result<Forgotten, ToolError> {
    let deleted = store
        .call(move |conn| {
            ensure_schema(conn)?;
            Ok(conn
                .query_row(
                    "DELETE FROM memory_items WHERE id = ?1 RETURNING content",
                    [id],
                    |r| r.get::<_, String>(0),
                )
                .optional()?)
        })
        .await?;
    deleted
        .map(|content| Forgotten { id, content })
        .ok_or_else(|| not_found(id))
}

async fn list(
    store: &SqliteStore,
    tag: Option<String>,
    limit: u32,
    offset: u32,
) -> Result<MemoryPage, ToolError> {
    Ok(store
        .call(move |conn| {
            ensure_schema(conn)?;
            let total: i64 = conn.query_row(
                &format!(
                    "SELECT count(*) FROM memory_items m WHERE {}",
                    tag_filter(1)
                ),
                [&tag],
                |r| r.get(0),
            )?;
            let sql = format!(
                "SELECT {COLUMNS} FROM memory_items m WHERE {}
                 ORDER BY m.updated_ms DESC, m.id DESC LIMIT ?2 OFFSET ?3",
                tag_filter(1)
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let memories = stmt
                .query_map(params![tag, limit, offset], memory_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(MemoryPage {
                memories,
                total,
                offset,
            })
        })
        .await?)
}

impl MemoryEngine for SqliteStore {
    fn remember(
        &self,
        content: String,
        tags: Vec<String>,
    ) -> BoxFuture<'_, Result<Remembered, ToolError>> {
        Box::pin(remember(self, content, tags))
    }

    fn recall<'a>(
        &'a self,
        query: &'a str,
        tag: Option<String>,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<RecalledMemory>, ToolError>> {
        Box::pin(recall(
            self,
            fts_query(query).unwrap_or_default(),
            tag,
            limit,
        ))
    }

    fn update(
        &self,
        id: i64,
        content: Option<String>,
        tags: Option<Vec<String>>,
    ) -> BoxFuture<'_, Result<Memory, ToolError>> {
        Box::pin(update(self, id, content, tags))
    }

    fn forget(&self, id: i64) -> BoxFuture<'_, Result<Forgotten, ToolError>> {
        Box::pin(forget(self, id))
    }

    fn list(
        &self,
        tag: Option<String>,
        limit: u32,
        offset: u32,
    ) -> BoxFuture<'_, Result<MemoryPage, ToolError>> {
        Box::pin(list(self, tag, limit, offset))
    }
}

/// An FTS5 query that matches any of the [`query_terms`], each as a quoted prefix
/// term (`AND`, `NEAR`, `"`, `*`, `:`, `^`, parentheses are never read as syntax).
/// `None` when no word is left.
pub fn fts_query(query: &str) -> Option<String> {
    let terms = query_terms(query);
    (!terms.is_empty()).then(|| {
        terms
            .iter()
            .map(|term| format!("\"{term}\"*"))
            .collect::<Vec<_>>()
            .join(" OR ")
    })
}

#[cfg(test)]
mod tests {
    use super::fts_query;

    #[test]
    fn fts_query_quotes_every_term() {
        assert_eq!(
            fts_query("Wifi AND \"pass*word\" NEAR(x)"),
            Some("\"wifi\"* OR \"and\"* OR \"pass\"* OR \"word\"* OR \"near\"* OR \"x\"*".into())
        );
        assert_eq!(
            fts_query("서울 여행, 서울"),
            Some("\"서울\"* OR \"여행\"*".into())
        );
        assert_eq!(fts_query(" ^*:() "), None);
        let many = (0..100)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let query = fts_query(&many).expect("terms");
        assert_eq!(
            query.matches(" OR ").count(),
            loadout::engine::memory::MAX_QUERY_TERMS - 1
        );
    }
}
