//! A static embedding table distilled from the built-in encoder (the Model2Vec
//! method, MinishLab 2024): every WordPiece token of the encoder's vocabulary goes
//! through the encoder once, alone; the rows are centred and weighted by the token's
//! estimated frequency (SIF over a Zipf law of the vocabulary's order). A text's
//! vector is then the normalised sum of its tokens' rows: microseconds where the
//! encoder takes milliseconds, at some cost in quality (docs/performance.md).
//!
//! Distilling takes the encoder's time for ~29,000 one-token texts (minutes), so
//! the table is built once per data dir, off the request path, and kept beside the
//! vector cache: `<dir>/static-<first 16 hex of sha256(model id)>.bin`,
//! little-endian: magic `LOSTA001`, `u32` length + model id bytes, `u32` rows,
//! `u32` dims, then per row an `f32` scale and `dims` `i8`s. Written to a temporary
//! file and renamed; a file that does not parse is distilled again.

use std::path::{Path, PathBuf};
use std::time::Instant;

use tokenizers::Tokenizer;

use crate::Embedder;

const MAGIC: &[u8; 8] = b"LOSTA001";

/// Model2Vec's SIF coefficient: a token's weight is `a / (a + p)` with `p` its
/// probability under a Zipf law of its rank in the vocabulary.
const SIF_COEFFICIENT: f64 = 1e-4;

/// Most tokens of a text that count (the encoder reads 128; a table row is cheap,
/// but a bound keeps a huge text from costing more than it says).
const MAX_TOKENS: usize = 1024;

/// The table and the tokenizer that maps text to its rows. Cheap to share (`Arc`).
pub struct StaticEncoder {
    tokenizer: Tokenizer,
    dims: usize,
    /// Per token: a scale and `dims` quantized values (row = scale * values).
    scales: Vec<f32>,
    values: Vec<i8>,
    model_id: String,
}

impl std::fmt::Debug for StaticEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticEncoder")
            .field("model_id", &self.model_id)
            .field("rows", &self.scales.len())
            .field("dims", &self.dims)
            .finish()
    }
}

/// The tokenizer of the built-in encoder (bert-base-uncased's WordPiece, from the
/// model's repository; Apache-2.0, see `assets/NOTICE`).
fn tokenizer() -> Result<Tokenizer, String> {
    let mut tokenizer = Tokenizer::from_bytes(include_bytes!("../assets/tokenizer.json"))
        .map_err(|e| format!("static table tokenizer: {e}"))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| format!("static table tokenizer: {e}"))?;
    Ok(tokenizer)
}

/// The static table's model id for a source encoder's.
pub fn static_model_id(source_model_id: &str) -> String {
    format!("static-v1+{source_model_id}")
}

/// The text a token is distilled from, or `None` for tokens text never maps to
/// (padding, the unused slots) and the markers the encoder adds itself.
fn distilled_text(token: &str) -> Option<&str> {
    if token.starts_with("[unused") || matches!(token, "[PAD]" | "[CLS]" | "[SEP]" | "[MASK]") {
        return None;
    }
    // A word piece is distilled as the piece alone: the encoder has no input for
    // "a continuation" without the word before it.
    let text = token.strip_prefix("##").unwrap_or(token);
    (!text.trim().is_empty()).then_some(text)
}

impl StaticEncoder {
    /// Distils the table from `source` (the built-in encoder), on `threads` threads.
    /// `only`: distil just these token ids (the others get zero rows), for tests.
    pub fn distill(
        source: &dyn Embedder,
        threads: usize,
        only: Option<&[u32]>,
    ) -> Result<StaticEncoder, String> {
        let tokenizer = tokenizer()?;
        let vocab = tokenizer.get_vocab_size(true);
        let ids: Vec<u32> = match only {
            Some(ids) => ids
                .iter()
                .copied()
                .filter(|&id| (id as usize) < vocab)
                .collect(),
            None => (0..vocab as u32).collect(),
        };
        let work: Vec<(u32, String)> = ids
            .iter()
            .filter_map(|&id| {
                let token = tokenizer.id_to_token(id)?;
                Some((id, distilled_text(&token)?.to_owned()))
            })
            .collect();
        let started = Instant::now();
        tracing::info!(
            "[router] distilling the static table: {} tokens through the encoder on {threads} \
             thread(s), once for this data dir (minutes; routing is lexical meanwhile)",
            work.len()
        );
        let rows = encode_each(source, &work, threads)?;
        let dims = rows.first().map_or(0, |(_, v)| v.len());
        if dims == 0 || rows.iter().any(|(_, v)| v.len() != dims) {
            return Err("the encoder's vectors have no or differing lengths".to_owned());
        }
        tracing::info!(
            "[router] static table: {} tokens distilled in {:.1} s",
            rows.len(),
            started.elapsed().as_secs_f64()
        );
        let table = weighted_rows(vocab, dims, &rows);
        Ok(StaticEncoder::from_rows(
            tokenizer,
            dims,
            &table,
            static_model_id(source.model_id()),
        ))
    }

    fn from_rows(tokenizer: Tokenizer, dims: usize, table: &[f32], model_id: String) -> Self {
        let mut scales = Vec::with_capacity(table.len() / dims.max(1));
        let mut values = Vec::with_capacity(table.len());
        for row in table.chunks_exact(dims) {
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = if max > 0.0 { max / 127.0 } else { 0.0 };
            scales.push(scale);
            values.extend(row.iter().map(|v| {
                if scale > 0.0 {
                    (v / scale).round().clamp(-127.0, 127.0) as i8
                } else {
                    0
                }
            }));
        }
        StaticEncoder {
            tokenizer,
            dims,
            scales,
            values,
            model_id,
        }
    }

    /// The table of `source` from `dir` when it was distilled there before, else
    /// distilled now (and written there). `None`: distilled, kept in memory only.
    pub fn load_or_distill(source: &dyn Embedder, dir: Option<&Path>) -> Result<Self, String> {
        let model_id = static_model_id(source.model_id());
        let path = dir.map(|dir| table_path(dir, &model_id));
        if let Some(path) = &path
            && let Some(table) = read(path, &model_id)
        {
            return Ok(table);
        }
        // A core stays free for requests (the threads also run at a lower priority).
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().max(2) - 1);
        let table = StaticEncoder::distill(source, threads, None)?;
        if let Some(path) = &path
            && let Err(e) = table.write(path)
        {
            tracing::warn!("static table {}: {e}", path.display());
        }
        Ok(table)
    }

    /// Writes the table to `path` (a temporary file, then renamed).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut bytes = crate::model_header(MAGIC, &self.model_id);
        bytes.reserve(8 + self.scales.len() * 4 + self.values.len());
        bytes.extend_from_slice(&(self.scales.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&(self.dims as u32).to_le_bytes());
        for (scale, row) in self.scales.iter().zip(self.values.chunks_exact(self.dims)) {
            bytes.extend_from_slice(&scale.to_le_bytes());
            bytes.extend(row.iter().map(|v| *v as u8));
        }
        crate::write_atomically(path, &bytes)
    }

    pub fn dims(&self) -> usize {
        self.dims
    }

    /// The normalised sum of the rows of `text`'s tokens; the zero vector when none
    /// of them has a row.
    pub fn vector(&self, text: &str) -> Result<Vec<f32>, String> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| format!("static table tokenizer: {e}"))?;
        let mut sum = vec![0f32; self.dims];
        for &id in encoding.get_ids().iter().take(MAX_TOKENS) {
            let id = id as usize;
            let Some(&scale) = self.scales.get(id) else {
                continue;
            };
            let row = &self.values[id * self.dims..(id + 1) * self.dims];
            for (s, v) in sum.iter_mut().zip(row) {
                *s += scale * f32::from(*v);
            }
        }
        loadout_router::normalize(&mut sum);
        Ok(sum)
    }
}

impl Embedder for StaticEncoder {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        texts.iter().map(|text| self.vector(text)).collect()
    }

    fn model_id(&self) -> &str {
        &self.model_id
    }
}

/// Token ids with their vectors.
type Rows = Vec<(u32, Vec<f32>)>;

/// Each text of `work` through `source` alone, on `threads` threads of lowered
/// priority (distilling must not starve request handling).
fn encode_each(
    source: &dyn Embedder,
    work: &[(u32, String)],
    threads: usize,
) -> Result<Rows, String> {
    let chunk = work.len().div_ceil(threads.clamp(1, 16)).max(1);
    let encode_part = |part: &[(u32, String)]| -> Result<Rows, String> {
        crate::message::lower_priority();
        part.iter()
            .map(|(id, text)| {
                let mut vectors = source.embed(&[text.as_str()])?;
                let vector = vectors.pop().ok_or("the encoder returned no vector")?;
                Ok((*id, vector))
            })
            .collect()
    };
    let parts: Vec<Result<Rows, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = work
            .chunks(chunk)
            .map(|part| scope.spawn(move || encode_part(part)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a distilling thread panicked".to_owned()))
            })
            .collect()
    });
    let mut rows = Rows::with_capacity(work.len());
    for part in parts {
        rows.extend(part?);
    }
    Ok(rows)
}

/// The rows as a `vocab * dims` table: centred on the mean of the distilled rows
/// (the direction every encoder output shares says nothing), then weighted by SIF.
/// Tokens not distilled keep zero rows.
fn weighted_rows(vocab: usize, dims: usize, rows: &[(u32, Vec<f32>)]) -> Vec<f32> {
    let mut mean = vec![0f64; dims];
    for (_, row) in rows {
        for (m, v) in mean.iter_mut().zip(row) {
            *m += f64::from(*v);
        }
    }
    mean.iter_mut().for_each(|m| *m /= rows.len().max(1) as f64);
    // Zipf: p(rank) = (1 / (rank + 2)) / H, as Model2Vec estimates it, over the
    // vocabulary's order (WordPiece vocabularies list frequent tokens first).
    let harmonic: f64 = (0..vocab).map(|rank| 1.0 / (rank as f64 + 2.0)).sum();
    let mut table = vec![0f32; vocab * dims];
    for (id, row) in rows {
        let id = *id as usize;
        let p = 1.0 / (id as f64 + 2.0) / harmonic;
        let weight = SIF_COEFFICIENT / (SIF_COEFFICIENT + p);
        for (k, v) in row.iter().enumerate() {
            table[id * dims + k] = ((f64::from(*v) - mean[k]) * weight) as f32;
        }
    }
    table
}

/// Where the table of `model_id` lives in `dir`.
pub fn table_path(dir: &Path, model_id: &str) -> PathBuf {
    crate::model_file(dir, "static", model_id)
}

/// The table at `path` if it parses and is `model_id`'s.
fn read(path: &Path, model_id: &str) -> Option<StaticEncoder> {
    let bytes = std::fs::read(path).ok()?;
    let rest = crate::after_model_header(&bytes, MAGIC, model_id)?;
    let (rows, rest) = rest.split_first_chunk::<4>()?;
    let (dims, rest) = rest.split_first_chunk::<4>()?;
    let (rows, dims) = (
        u32::from_le_bytes(*rows) as usize,
        u32::from_le_bytes(*dims) as usize,
    );
    let tokenizer = tokenizer().ok()?;
    if dims == 0 || rows != tokenizer.get_vocab_size(true) || rest.len() != rows * (4 + dims) {
        return None;
    }
    let mut scales = Vec::with_capacity(rows);
    let mut values = Vec::with_capacity(rows * dims);
    for row in rest.chunks_exact(4 + dims) {
        let (scale, row) = row.split_first_chunk::<4>()?;
        let scale = f32::from_le_bytes(*scale);
        if !scale.is_finite() || scale < 0.0 {
            return None;
        }
        scales.push(scale);
        values.extend(row.iter().map(|b| *b as i8));
    }
    Some(StaticEncoder {
        tokenizer,
        dims,
        scales,
        values,
        model_id: model_id.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// Counts the texts it is asked for; embeds nothing.
    struct Refusing(String, AtomicUsize);
    impl Embedder for Refusing {
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
            self.1.fetch_add(texts.len(), Ordering::Relaxed);
            Err("not expected to embed".to_owned())
        }
        fn model_id(&self) -> &str {
            &self.0
        }
    }

    #[test]
    fn a_distilled_table_ranks_paraphrases_first_and_is_read_back_not_distilled_again() {
        let source = crate::BuiltinEncoder::load().expect("built-in encoder");
        let texts = [
            "switch off the lights in the living room",
            "turn the lamp off",
            "what is the weather forecast for tomorrow",
            "will it rain",
            "delete the old backup",
        ];
        let tokenizer = tokenizer().expect("tokenizer");
        let mut ids: Vec<u32> = texts
            .iter()
            .flat_map(|t| {
                tokenizer
                    .encode(*t, false)
                    .expect("encode")
                    .get_ids()
                    .to_vec()
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let table = StaticEncoder::distill(&source, 2, Some(&ids)).expect("distilled");
        assert_eq!(table.model_id(), static_model_id(source.model_id()));
        let vectors = table.embed(&texts).expect("vectors");
        assert!(vectors.iter().all(|v| v.len() == 384));
        // The lights paraphrase is nearer the lights message than the weather and the
        // backup are; likewise for the weather.
        assert!(cosine(&vectors[0], &vectors[1]) > cosine(&vectors[0], &vectors[2]));
        assert!(cosine(&vectors[0], &vectors[1]) > cosine(&vectors[0], &vectors[4]));
        assert!(cosine(&vectors[2], &vectors[3]) > cosine(&vectors[2], &vectors[1]));
        // Text none of whose tokens has a row gives the zero vector, not an error.
        let blank = table.vector("\u{200b}").expect("vector");
        assert!(blank.iter().all(|v| *v == 0.0));

        let dir = tempfile::tempdir().expect("tempdir");
        let path = table_path(dir.path(), table.model_id());
        table.write(&path).expect("written");
        let refusing = Refusing(source.model_id().to_owned(), AtomicUsize::new(0));
        let again = StaticEncoder::load_or_distill(&refusing, Some(dir.path())).expect("read");
        assert_eq!(refusing.1.load(Ordering::Relaxed), 0, "read, not distilled");
        assert_eq!(again.embed(&texts).expect("vectors"), vectors);
        // Another model's table is not this one's; a cut file is distilled again.
        assert!(read(&path, "static-v1+another").is_none());
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..bytes.len() - 1]).expect("cut");
        assert!(read(&path, table.model_id()).is_none());
        assert!(StaticEncoder::load_or_distill(&refusing, Some(dir.path())).is_err());
        assert!(refusing.1.load(Ordering::Relaxed) > 0, "distilled again");
    }
}
