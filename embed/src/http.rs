//! The router's second [`Embedder`]: any OpenAI-compatible `/v1/embeddings` endpoint
//! (Ollama, llama.cpp, vLLM, OpenAI), for multilingual models the built-in encoder
//! does not cover. Configured by settings: `embeddings_base_url` (e.g.
//! `http://localhost:11434/v1`), `embeddings_model`, and optionally
//! `embeddings_api_key` (sent as a bearer token).
//!
//! [`Embedder::embed`] is synchronous (the router is), so the request runs on the
//! caller's Tokio runtime with `block_in_place` when that is a multi-threaded runtime,
//! and on a short-lived thread with its own runtime otherwise. Idle connections are
//! not pooled, because a pool would outlive those per-call runtimes. Any failure comes
//! back as an error string: the router then routes lexical-only and notes why.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::Embedder;
use serde::Deserialize;

/// Settings keys of the endpoint.
pub const BASE_URL_KEY: &str = "embeddings_base_url";
pub const MODEL_KEY: &str = "embeddings_model";
pub const API_KEY_KEY: &str = "embeddings_api_key";

/// Longest wait for one embeddings request.
const TIMEOUT: Duration = Duration::from_secs(10);

/// An OpenAI-compatible embeddings endpoint.
#[derive(Debug, Clone)]
pub struct HttpEmbedder {
    url: String,
    model: String,
    api_key: Option<String>,
    model_id: String,
    client: reqwest::Client,
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    data: Vec<EmbeddingRow>,
}

#[derive(Deserialize)]
struct EmbeddingRow {
    embedding: Vec<f32>,
    #[serde(default)]
    index: Option<usize>,
}

impl HttpEmbedder {
    /// The endpoint the settings name, or `None` when `embeddings_base_url` or
    /// `embeddings_model` is unset.
    pub fn from_settings(
        settings: &BTreeMap<String, String>,
    ) -> Option<Result<HttpEmbedder, String>> {
        let value = |key: &str| {
            settings
                .get(key)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let base_url = value(BASE_URL_KEY)?;
        let model = value(MODEL_KEY)?;
        Some(HttpEmbedder::new(&base_url, &model, value(API_KEY_KEY)))
    }

    pub fn new(
        base_url: &str,
        model: &str,
        api_key: Option<String>,
    ) -> Result<HttpEmbedder, String> {
        let base = base_url.trim_end_matches('/');
        let url = format!("{base}/embeddings");
        // reqwest is built without a TLS provider of its own (see Cargo.toml); the
        // process-wide one may already be installed by the chat client.
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| format!("embeddings client: {e}"))?;
        Ok(HttpEmbedder {
            model_id: format!("openai-compatible:{base}#{model}"),
            url,
            model: model.to_owned(),
            api_key,
            client,
        })
    }

    async fn embed_async(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, String> {
        let n_texts = texts.len();
        let mut request = self
            .client
            .post(&self.url)
            .json(&serde_json::json!({"model": self.model, "input": texts}));
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("embeddings endpoint unreachable: {e}"))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("embeddings endpoint answered {status}"));
        }
        let mut body: EmbeddingsResponse = response
            .json()
            .await
            .map_err(|e| format!("embeddings endpoint: unexpected answer: {e}"))?;
        if body.data.len() != n_texts {
            return Err(format!(
                "embeddings endpoint returned {} vectors for {n_texts} texts",
                body.data.len()
            ));
        }
        if body.data.iter().all(|row| row.index.is_some()) {
            body.data.sort_by_key(|row| row.index);
        }
        Ok(body.data.into_iter().map(|row| row.embedding).collect())
    }
}

impl Embedder for HttpEmbedder {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        let owned: Vec<String> = texts.iter().map(|t| (*t).to_owned()).collect();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| handle.block_on(self.embed_async(owned)))
            }
            _ => std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .map_err(|e| format!("embeddings runtime: {e}"))?
                            .block_on(self.embed_async(owned))
                    })
                    .join()
                    .unwrap_or_else(|_| Err("embeddings request panicked".to_owned()))
            }),
        }
    }

    fn model_id(&self) -> &str {
        &self.model_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Json;
    use axum::routing::post;

    use crate::{EncoderOptions, MessageEncoder};

    /// A tiny `/v1/embeddings` server: vector = [len, count of 'a'], rows reversed
    /// (so the client must sort by `index`), 401 without the right key.
    async fn serve() -> String {
        let app = axum::Router::new().route(
            "/v1/embeddings",
            post(
                |headers: axum::http::HeaderMap, Json(body): Json<serde_json::Value>| async move {
                    if headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        != Some("Bearer sekrit")
                    {
                        return Err(axum::http::StatusCode::UNAUTHORIZED);
                    }
                    let inputs: Vec<String> = body["input"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect();
                    let mut data: Vec<serde_json::Value> = inputs
                        .iter()
                        .enumerate()
                        .map(|(i, t)| {
                            serde_json::json!({"index": i, "embedding": [t.len() as f32, t.matches('a').count() as f32]})
                        })
                        .collect();
                    data.reverse();
                    Ok(Json(serde_json::json!({"data": data, "model": body["model"]})))
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        format!("http://{addr}/v1")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embeds_through_an_openai_compatible_endpoint() {
        let base = serve().await;
        let settings = BTreeMap::from([
            (BASE_URL_KEY.to_owned(), base.clone()),
            (MODEL_KEY.to_owned(), "nomic-embed-text".to_owned()),
            (API_KEY_KEY.to_owned(), "sekrit".to_owned()),
        ]);
        let embedder = HttpEmbedder::from_settings(&settings)
            .unwrap_or_else(|| panic!("configured"))
            .unwrap_or_else(|e| panic!("{e}"));
        let vectors = embedder
            .embed(&["banana", "xyz"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(vectors, vec![vec![6.0, 3.0], vec![3.0, 0.0]]);
        assert!(embedder.model_id().ends_with("#nomic-embed-text"));

        // From a plain thread (no runtime) as well.
        let from_thread = std::thread::spawn({
            let embedder = embedder.clone();
            move || embedder.embed(&["aa"])
        })
        .join()
        .unwrap_or_else(|_| panic!("thread"));
        assert_eq!(from_thread, Ok(vec![vec![2.0, 2.0]]));

        // Wrong key, or nothing listening: an error, never a panic.
        let wrong =
            HttpEmbedder::new(&base, "m", Some("nope".into())).unwrap_or_else(|e| panic!("{e}"));
        assert!(wrong.embed(&["a"]).is_err_and(|e| e.contains("401")));
        let down =
            HttpEmbedder::new("http://127.0.0.1:9/v1", "m", None).unwrap_or_else(|e| panic!("{e}"));
        assert!(down.embed(&["a"]).is_err());
        assert!(HttpEmbedder::from_settings(&BTreeMap::new()).is_none());
    }

    /// An endpoint that answers after 100 ms and counts its requests.
    async fn serve_counting() -> (String, Arc<AtomicUsize>) {
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let app = axum::Router::new().route(
            "/v1/embeddings",
            post(move |Json(body): Json<serde_json::Value>| {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let data: Vec<serde_json::Value> = body["input"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .enumerate()
                        .map(|(i, t)| {
                            let len = t.as_str().map_or(0, str::len) as f32;
                            serde_json::json!({"index": i, "embedding": [len, 1.0]})
                        })
                        .collect();
                    Json(serde_json::json!({"data": data}))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (format!("http://{addr}/v1"), requests)
    }

    /// `embeddings_base_url` behind the message encoder: messages that arrive while
    /// a request is out go in the next request together, and a repeated message
    /// sends none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn messages_reach_an_endpoint_batched_and_cached() {
        let (base, requests) = serve_counting().await;
        let embedder = HttpEmbedder::new(&base, "m", None).unwrap_or_else(|e| panic!("{e}"));
        let options = EncoderOptions {
            workers: 1,
            max_batch: embedder.max_batch(),
            cache_entries: 64,
        };
        let encoder = Arc::new(
            MessageEncoder::new(Arc::new(embedder), options).unwrap_or_else(|e| panic!("{e}")),
        );
        let embed_all = |encoder: &Arc<MessageEncoder>| {
            let threads: Vec<_> = (0..6)
                .map(|i| {
                    let encoder = encoder.clone();
                    std::thread::spawn(move || encoder.message_vectors(&format!("message {i}")))
                })
                .collect();
            threads
                .into_iter()
                .all(|t| t.join().is_ok_and(|v| v.is_dense()))
        };
        let encoder_in_thread = encoder.clone();
        assert!(
            tokio::task::spawn_blocking(move || embed_all(&encoder_in_thread))
                .await
                .unwrap_or(false)
        );
        let sent = requests.load(Ordering::SeqCst);
        assert!(sent < 6, "{sent} requests for 6 messages");
        let encoder_in_thread = encoder.clone();
        assert!(
            tokio::task::spawn_blocking(move || embed_all(&encoder_in_thread))
                .await
                .unwrap_or(false)
        );
        assert_eq!(
            requests.load(Ordering::SeqCst),
            sent,
            "the repeats were cached"
        );
    }
}
