//! Statements and functions `query_data` refuses by name before PostgreSQL sees
//! them: a second guard behind the query role.

/// Statements `query_data` refuses before the database sees them: they change the
/// session (whose connection other work may have used before it is dropped) or the
/// server, or reach files and other databases.
const REFUSED_STATEMENTS: [&str; 12] = [
    "set",
    "reset",
    "copy",
    "load",
    "do",
    "call",
    "listen",
    "notify",
    "discard",
    "lock",
    "vacuum",
    "checkpoint",
];
/// Functions that read or write server files, reach other databases, change
/// settings or signal backends, and those that run SQL given as text (which would
/// hide a call of the others from this check). The query role holds no privilege
/// for most of them; refusing the names as well keeps that from being the only guard.
const REFUSED_FUNCTIONS: [&str; 30] = [
    "pg_read_file",
    "pg_read_binary_file",
    "pg_ls_dir",
    "pg_stat_file",
    "pg_file_write",
    "lo_import",
    "lo_export",
    "lo_from_bytea",
    "lo_put",
    "lo_open",
    "dblink",
    "dblink_exec",
    "dblink_connect",
    "dblink_send_query",
    "set_config",
    "pg_reload_conf",
    "pg_rotate_logfile",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_sleep",
    "pg_sleep_for",
    "pg_sleep_until",
    "pg_advisory_lock",
    "pg_advisory_xact_lock",
    "query_to_xml",
    "query_to_xml_and_xmlschema",
    "query_to_xmlschema",
    "cursor_to_xml",
    "database_to_xml",
    "pg_logical_emit_message",
];

/// What in `sql` is refused, if anything: the statement's first word, then every
/// identifier, outside string literals, dollar quotes and comments (unquoted words
/// folded to lowercase, as PostgreSQL does).
pub(super) fn refused_statement(sql: &str) -> Option<String> {
    let words = sql_words(sql);
    if words.iter().any(|w| w == UNICODE_IDENTIFIER) {
        return Some("a Unicode-escaped identifier (U&\"…\")".to_owned());
    }
    if let Some(first) = words.first()
        && REFUSED_STATEMENTS.contains(&first.as_str())
    {
        return Some(first.to_ascii_uppercase());
    }
    words
        .iter()
        .find(|w| REFUSED_FUNCTIONS.contains(&w.as_str()))
        .map(|w| format!("{w}()"))
}

/// Stands for a `U&"…"` identifier among [`sql_words`]' words (no identifier has a
/// space).
const UNICODE_IDENTIFIER: &str = "u& identifier";

/// The identifiers and keywords of `sql`, in order.
fn sql_words(sql: &str) -> Vec<String> {
    let chars: Vec<char> = sql.chars().collect();
    let mut words = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '-' && next == Some('-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest in PostgreSQL.
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '\'' {
            // A literal; E'…' strings may escape a quote with a backslash.
            let escapes = i > 0 && matches!(chars[i - 1], 'e' | 'E');
            i += 1;
            while i < chars.len() {
                if escapes && chars[i] == '\\' {
                    i += 2;
                } else if chars[i] == '\'' {
                    if chars.get(i + 1) == Some(&'\'') {
                        i += 2;
                    } else {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            i += 1;
        } else if c == '"' {
            // `U&"\0070g_read_file"` spells a name this check would not see.
            if i >= 2 && chars[i - 1] == '&' && matches!(chars[i - 2], 'u' | 'U') {
                words.push(UNICODE_IDENTIFIER.to_owned());
            }
            let mut word = String::new();
            i += 1;
            while i < chars.len() {
                if chars[i] == '"' {
                    if chars.get(i + 1) == Some(&'"') {
                        word.push('"');
                        i += 2;
                        continue;
                    }
                    break;
                }
                word.push(chars[i]);
                i += 1;
            }
            i += 1;
            words.push(word);
        } else if c == '$' && !(i > 0 && is_word_char(chars[i - 1])) {
            // A dollar quote `$tag$…$tag$` (or a parameter `$1`, which has no tag end).
            let tag_end = chars[i + 1..]
                .iter()
                .position(|ch| !is_word_char(*ch))
                .map(|p| i + 1 + p);
            match tag_end {
                Some(end) if chars[end] == '$' => {
                    let tag = &chars[i..=end];
                    let mut j = end + 1;
                    while j < chars.len() && !chars[j..].starts_with(tag) {
                        j += 1;
                    }
                    i = j + tag.len();
                }
                _ => i += 1,
            }
        } else if is_word_char(c) && !c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && (is_word_char(chars[i]) || chars[i] == '$') {
                i += 1;
            }
            words.push(chars[start..i].iter().collect::<String>().to_lowercase());
        } else {
            i += 1;
        }
    }
    words
}

fn is_word_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// N1 of issue 36: statements that change the session or the server, and
    /// functions that reach files or other databases, are refused before they run,
    /// however they are spelled.
    #[test]
    fn refused_statements_are_found_outside_literals() {
        for sql in [
            "SET work_mem = '1TB'",
            "  reset ALL",
            "/* x */ COPY people TO PROGRAM 'id'",
            "-- c\nset statement_timeout = 0",
            "SELECT pg_read_file('/etc/passwd')",
            "SELECT PG_READ_BINARY_FILE('x')",
            "SELECT \"pg_ls_dir\"('.')",
            "SELECT pg_catalog.lo_import('/etc/passwd')",
            "SELECT * FROM dblink('host=x', 'select 1') AS t(a int)",
            "SELECT set_config('statement_timeout', '0', false)",
            "SELECT query_to_xml('select pg_read_file(''x'')', true, true, '')",
            "SELECT $$x$$, pg_sleep(100)",
            "SELECT U&\"\\0070g_read_file\"('x')",
        ] {
            assert!(refused_statement(sql).is_some(), "{sql}");
        }
        for sql in [
            "SELECT 'set', 'pg_read_file(x)' FROM people",
            "SELECT name AS \"copy\" FROM people -- pg_read_file(",
            "SELECT $tag$ pg_read_file $tag$, E'it\\'s dblink'",
            "WITH settings AS (SELECT 1) SELECT * FROM settings",
            "SELECT /* set /* nested */ copy */ 1",
            "SHOW work_mem",
        ] {
            assert_eq!(refused_statement(sql), None, "{sql}");
        }
    }
}
