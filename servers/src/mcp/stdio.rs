//! MCP over stdio with JSON-RPC's error replies: newline-delimited messages in and
//! out, like rmcp's own stdio transport, except that a line that is not a message
//! gets an error reply ([`super::jsonrpc`]) instead of silence, and so does a line
//! too long to read (rmcp drops both without a word, and its client then waits for an
//! answer that never comes).
//!
//! A reader task reads and classifies lines, a writer task writes replies in order;
//! the transport's `receive` is a channel receive, which rmcp may cancel freely (it
//! polls it inside a `select!`).

use std::future::Future;

use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::jsonrpc::{self, Incoming};

/// Longest line read (one message): rmcp's own limit for stdio, and its HTTP
/// client's for one event, so that what is accepted over HTTP is accepted here.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// How much of an oversized line's start and end is kept to find its id.
const ID_WINDOW_BYTES: usize = 64 * 1024;
/// Messages waiting either way; a full queue holds the reader back (a client that
/// floods us and reads nothing stops being read) instead of buffering without end.
const QUEUE: usize = 64;

pub struct StdioLines {
    incoming: mpsc::Receiver<ClientJsonRpcMessage>,
    outgoing: Option<mpsc::Sender<Vec<u8>>>,
    reader: JoinHandle<()>,
    writer: Option<JoinHandle<()>>,
}

impl StdioLines {
    /// Over the process's stdin and stdout (non-blocking where they are pipes, so that
    /// shutting down is not stuck in a read).
    pub fn start() -> StdioLines {
        let (read, write) = rmcp::transport::stdio_pipes();
        StdioLines::new(read, write, MAX_LINE_BYTES)
    }

    pub fn new<R, W>(read: R, write: W, max_line_bytes: usize) -> StdioLines
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (incoming_tx, incoming) = mpsc::channel(QUEUE);
        let (outgoing_tx, outgoing_rx) = mpsc::channel(QUEUE);
        let reader = tokio::spawn(read_lines(
            BufReader::new(read),
            max_line_bytes,
            incoming_tx,
            outgoing_tx.clone(),
        ));
        let writer = tokio::spawn(write_lines(write, outgoing_rx));
        StdioLines {
            incoming,
            outgoing: Some(outgoing_tx),
            reader,
            writer: Some(writer),
        }
    }
}

impl Drop for StdioLines {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

#[derive(Debug, thiserror::Error)]
#[error("stdout is closed")]
pub struct Closed;

impl Transport<RoleServer> for StdioLines {
    type Error = Closed;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let outgoing = self.outgoing.clone();
        async move {
            let outgoing = outgoing.ok_or(Closed)?;
            let line = serde_json::to_vec(&item).map_err(|e| {
                tracing::error!("MCP message not serializable: {e}");
                Closed
            })?;
            outgoing.send(line).await.map_err(|_| Closed)
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        self.incoming.recv().await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.reader.abort();
        // The writer ends once every queued line is written and no sender is left.
        drop(self.outgoing.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.await;
        }
        Ok(())
    }
}

async fn write_lines<W: AsyncWrite + Unpin>(mut write: W, mut lines: mpsc::Receiver<Vec<u8>>) {
    while let Some(mut line) = lines.recv().await {
        line.push(b'\n');
        if let Err(e) = write_flushed(&mut write, &line).await {
            tracing::debug!("stdout closed: {e}");
            return;
        }
    }
}

async fn write_flushed<W: AsyncWrite + Unpin>(write: &mut W, line: &[u8]) -> std::io::Result<()> {
    write.write_all(line).await?;
    write.flush().await
}

/// One line as read: whole, or too long (its first and last bytes kept).
enum Line {
    Whole(Vec<u8>),
    TooLong { head: Vec<u8>, tail: Vec<u8> },
}

async fn read_lines<R: AsyncRead + Unpin>(
    mut read: BufReader<R>,
    max_line_bytes: usize,
    incoming: mpsc::Sender<ClientJsonRpcMessage>,
    outgoing: mpsc::Sender<Vec<u8>>,
) {
    loop {
        let line = match read_line(&mut read, max_line_bytes).await {
            Ok(Some(line)) => line,
            // EOF: the client is gone; the closed channel ends the service.
            Ok(None) => return,
            Err(e) => {
                tracing::debug!("stdin: {e}");
                return;
            }
        };
        let reply = match line {
            Line::TooLong { head, tail } => jsonrpc::oversized(&head, &tail, max_line_bytes),
            Line::Whole(bytes) => {
                let bytes = bytes.strip_suffix(b"\r").unwrap_or(&bytes);
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match jsonrpc::classify(bytes) {
                    Incoming::Message(message) => {
                        if incoming.send(*message).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    Incoming::Ignored => continue,
                    Incoming::Reply(reply) => reply,
                }
            }
        };
        if outgoing.send(reply_line(&reply)).await.is_err() {
            return;
        }
    }
}

fn reply_line(reply: &Value) -> Vec<u8> {
    // A `Value` always serializes.
    serde_json::to_vec(reply).unwrap_or_default()
}

/// Reads one `\n`-terminated line without holding more than `max` bytes of it: a
/// longer line is read to its end but only its first and last bytes are kept.
/// `None` at EOF (a last line without a newline is not a message).
async fn read_line<R: AsyncRead + Unpin>(
    read: &mut BufReader<R>,
    max: usize,
) -> std::io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut too_long: Option<(Vec<u8>, Vec<u8>)> = None;
    loop {
        let available = read.fill_buf().await?;
        if available.is_empty() {
            return Ok(None);
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let chunk = &available[..newline.unwrap_or(available.len())];
        match &mut too_long {
            None if line.len() + chunk.len() <= max => line.extend_from_slice(chunk),
            None => {
                line.extend_from_slice(chunk);
                let head = line[..ID_WINDOW_BYTES.min(line.len())].to_vec();
                let mut tail = Vec::new();
                keep_tail(&mut tail, &line);
                too_long = Some((head, tail));
                line = Vec::new();
            }
            Some((_, tail)) => keep_tail(tail, chunk),
        }
        let consumed = newline.map_or(available.len(), |i| i + 1);
        read.consume(consumed);
        if newline.is_some() {
            return Ok(Some(match too_long {
                Some((head, tail)) => Line::TooLong { head, tail },
                None => Line::Whole(line),
            }));
        }
    }
}

fn keep_tail(tail: &mut Vec<u8>, more: &[u8]) {
    tail.extend_from_slice(more);
    if tail.len() > ID_WINDOW_BYTES {
        tail.drain(..tail.len() - ID_WINDOW_BYTES);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use serde_json::json;
    use tokio::io::DuplexStream;

    /// The transport, and the client's ends: its stdin to write (dropping it is EOF)
    /// and its stdout to read.
    fn connected(max_line_bytes: usize) -> (StdioLines, (DuplexStream, BufReader<DuplexStream>)) {
        let (client_stdin, server_stdin) = tokio::io::duplex(1 << 20);
        let (server_stdout, client_stdout) = tokio::io::duplex(1 << 20);
        let transport = StdioLines::new(server_stdin, server_stdout, max_line_bytes);
        (transport, (client_stdin, BufReader::new(client_stdout)))
    }

    async fn receive(transport: &mut StdioLines) -> Option<ClientJsonRpcMessage> {
        tokio::time::timeout(Duration::from_secs(5), transport.receive())
            .await
            .expect("receive in time")
    }

    async fn next_line(read: &mut BufReader<DuplexStream>) -> Value {
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(5), read.read_line(&mut line))
            .await
            .expect("a line in time")
            .expect("read");
        serde_json::from_str(&line).expect("one JSON message per line")
    }

    #[tokio::test]
    async fn bad_lines_get_error_replies_and_messages_go_through() {
        let (mut transport, (mut write, mut read)) = connected(1024);
        let long = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":31,\"method\":\"tools/call\",\"params\":{{\"text\":\"{}\"}}}}\n",
            "a".repeat(5000)
        );
        let input = [
            "{bad\n",
            "\n",
            "\r\n",
            "{\"jsonrpc\":\"2.0\",\"id\":7}\r\n",
            long.as_str(),
            // An unknown notification: no reply (JSON-RPC answers no notification).
            "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/whatever\",\"params\":[1]}\n",
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n",
        ]
        .concat();
        write.write_all(input.as_bytes()).await.expect("write");

        let mut replies = Vec::new();
        for _ in 0..3 {
            let reply = next_line(&mut read).await;
            assert!(
                reply.as_object().is_some_and(|r| r.contains_key("id")),
                "{reply}"
            );
            replies.push((reply["id"].clone(), reply["error"]["code"].clone()));
        }
        assert_eq!(
            replies,
            [
                (Value::Null, json!(-32700)),
                (json!(7), json!(-32600)),
                (json!(31), json!(-32600)),
            ]
        );
        let message = receive(&mut transport).await.expect("a message");
        assert_eq!(
            serde_json::to_value(&message).expect("JSON")["method"],
            json!("ping")
        );

        // The server's own messages go out on the same stream, after the replies.
        transport
            .send(ServerJsonRpcMessage::error(
                rmcp::model::ErrorData::internal_error("x", None),
                Some(rmcp::model::RequestId::Number(1)),
            ))
            .await
            .expect("send");
        assert_eq!(next_line(&mut read).await["id"], json!(1));

        drop(write);
        assert!(
            receive(&mut transport).await.is_none(),
            "EOF ends the stream"
        );
        transport.close().await.expect("close");
    }

    #[tokio::test]
    async fn an_endless_line_is_read_in_bounded_memory_and_answered() {
        let (mut transport, (mut write, mut read)) = connected(64 * 1024);
        let writer = tokio::spawn(async move {
            write
                .write_all(
                    b"{\"id\":\"big\",\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":\"",
                )
                .await?;
            let chunk = vec![b'x'; 1 << 16];
            for _ in 0..64 {
                write.write_all(&chunk).await?;
            }
            write
                .write_all(b"\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\n")
                .await?;
            Ok::<_, std::io::Error>(write)
        });
        let reply = next_line(&mut read).await;
        assert_eq!(
            (reply["id"].clone(), reply["error"]["code"].clone()),
            (json!("big"), json!(-32600))
        );
        let message = receive(&mut transport).await.expect("the next message");
        assert_eq!(
            serde_json::to_value(&message).expect("JSON")["id"],
            json!(2)
        );
        drop(writer.await.expect("join").expect("write"));
        transport.close().await.expect("close");
    }
}
