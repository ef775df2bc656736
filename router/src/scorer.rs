//! The fitted scorer: per tool, the features the stages gather (keyword hits, BM25,
//! dense cosines and ranks, the session, learned votes, companions and next steps
//! declared or learned from use, the domain's size, ...) turned into the probability
//! that this turn calls the tool, by a logistic regression fitted on labeled turns
//! with folds by conversation (`cargo xtask fit`, `loadout fit`). The weights are
//! data (`router/weights.json`), not code: a deployment refits them on its own
//! learned memory.
//!
//! The lexical and dense paths have a model each: a feature the path lacks would
//! otherwise read as evidence against every tool.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::selection::Why;

/// The features, in the order of a feature row.
pub const FEATURES: [&str; N_FEATURES] = [
    "tool_bm25",
    "tool_bm25_rel",
    "tool_bm25_rank",
    "domain_bm25_rel",
    "domain_bm25_rank",
    "tool_keyword",
    "domain_keyword",
    "keyword_in_domain",
    "domain_last_turn",
    "domain_sticky",
    "tool_called_recently",
    "carried",
    "next_step",
    "companion",
    "learned_tool",
    "learned_domain",
    "small_domain_evidence",
    "destructive",
    "read_first",
    "names_action",
    "tool_dense",
    "tool_dense_rel",
    "tool_dense_rank",
    "domain_dense_rel",
    "domain_dense_rank",
    "learned_tool_rank",
    "pending",
    "tool_dense2",
    "tool_dense2_rel",
    "tool_dense2_rank",
    "tool_dense2_top3",
];

pub const N_FEATURES: usize = 31;

/// Names that weights files of earlier versions may hold: a feature renamed (read as
/// its new name) or merged into another (read as nothing: refit to weigh it).
const RETIRED: [(&str, Option<&str>); 3] = [
    ("prerequisite", Some("companion")),
    ("co_usage", None),
    ("follows", None),
];

/// One feature row.
pub type Row = [f32; N_FEATURES];

/// Feature indices.
pub mod f {
    pub const TOOL_BM25: usize = 0;
    pub const TOOL_BM25_REL: usize = 1;
    pub const TOOL_BM25_RANK: usize = 2;
    pub const DOMAIN_BM25_REL: usize = 3;
    pub const DOMAIN_BM25_RANK: usize = 4;
    pub const TOOL_KEYWORD: usize = 5;
    pub const DOMAIN_KEYWORD: usize = 6;
    pub const KEYWORD_IN_DOMAIN: usize = 7;
    pub const DOMAIN_LAST_TURN: usize = 8;
    pub const DOMAIN_STICKY: usize = 9;
    pub const TOOL_CALLED_RECENTLY: usize = 10;
    pub const CARRIED: usize = 11;
    pub const NEXT_STEP: usize = 12;
    pub const COMPANION: usize = 13;
    pub const LEARNED_TOOL: usize = 14;
    pub const LEARNED_DOMAIN: usize = 15;
    pub const SMALL_DOMAIN_EVIDENCE: usize = 16;
    pub const DESTRUCTIVE: usize = 17;
    pub const READ_FIRST: usize = 18;
    pub const NAMES_ACTION: usize = 19;
    pub const TOOL_DENSE: usize = 20;
    pub const TOOL_DENSE_REL: usize = 21;
    pub const TOOL_DENSE_RANK: usize = 22;
    pub const DOMAIN_DENSE_REL: usize = 23;
    pub const DOMAIN_DENSE_RANK: usize = 24;
    pub const LEARNED_TOOL_RANK: usize = 25;
    pub const PENDING: usize = 26;
    /// The second encoder of a joined dense stage (see `DenseIndex::joined`).
    pub const TOOL_DENSE2: usize = 27;
    pub const TOOL_DENSE2_REL: usize = 28;
    pub const TOOL_DENSE2_RANK: usize = 29;
    pub const TOOL_DENSE2_TOP3: usize = 30;
}

/// The fitted weights of every path, as `router/weights.json` holds them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weights {
    pub lexical: Model,
    pub dense: Model,
    /// The dense path with a joined stage (a second encoder's cosines beside the
    /// first's, see `DenseIndex::joined`). Without it, such a stage is scored by
    /// `dense`, which weighs the second encoder's features 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined: Option<Model>,
    /// How the weights were fitted (data, folds, date, fold figures): for people.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub fitted: serde_json::Value,
}

/// One path's logistic regression and the selection rule's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    pub bias: f32,
    /// By feature name; a feature left out weighs 0.
    pub weights: BTreeMap<String, f32>,
    pub selection: SelectionRule,
}

/// How probabilities become a selection (see `Pass::send_by_probability`), fitted
/// with the weights on the same folds. Every threshold is relative to the turn's own
/// probabilities, so that one rule holds for 30 tools and for 4,000.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectionRule {
    /// Tools are sent best first until they hold this share of the probability mass
    /// of every candidate (the expected share of the turn's needed tools sent) ...
    pub coverage: f32,
    /// ... while the next tool's probability is at least this share of the
    /// likeliest tool's ...
    pub min_ratio: f32,
    /// ... and at least this (a tool nothing points at stays out of a large catalog).
    pub min_probability: f32,
    /// A domain whose likeliest tool reaches this share of the turn's likeliest ...
    pub whole_domain_ratio: f32,
    /// ... and whose tools together cost at most this share of the token budget is
    /// sent whole: a small domain's tools travel together (companions the message
    /// never names).
    pub whole_domain_share: f32,
    /// A selection under this many tokens takes the next likeliest tools while it
    /// stays under it: unsure, the router uses the room it has.
    #[serde(default)]
    pub fill_tokens: usize,
}

impl Default for SelectionRule {
    fn default() -> Self {
        SelectionRule {
            coverage: 0.9,
            min_ratio: 0.05,
            min_probability: 0.002,
            whole_domain_ratio: 0.5,
            whole_domain_share: 0.5,
            fill_tokens: 0,
        }
    }
}

impl Model {
    /// A model with these weights, in feature order.
    pub fn from_row(bias: f32, weights: &Row, selection: SelectionRule) -> Model {
        Model {
            bias,
            weights: FEATURES
                .iter()
                .zip(weights)
                .map(|(name, &w)| ((*name).to_owned(), w))
                .collect(),
            selection,
        }
    }

    fn row(&self) -> Row {
        let mut row = [0.0; N_FEATURES];
        for (slot, name) in row.iter_mut().zip(FEATURES) {
            let old = RETIRED.iter().find(|(_, new)| *new == Some(name));
            *slot = self
                .weights
                .get(name)
                .or_else(|| old.and_then(|(old, _)| self.weights.get(*old)))
                .copied()
                .unwrap_or(0.0);
        }
        row
    }
}

impl Weights {
    /// The weights shipped with the router.
    pub fn shipped() -> Weights {
        // Checked by a test: the file parses and names only known features.
        serde_json::from_str(include_str!("../weights.json")).unwrap_or_else(|_| Weights {
            lexical: Model::from_row(-4.0, &[0.0; N_FEATURES], SelectionRule::default()),
            dense: Model::from_row(-4.0, &[0.0; N_FEATURES], SelectionRule::default()),
            joined: None,
            fitted: serde_json::Value::Null,
        })
    }

    /// The encoder whose cosines the dense model was fitted on, as the fit wrote it.
    pub fn dense_encoder(&self) -> Option<&str> {
        self.fitted.get("dense")?.get("encoder")?.as_str()
    }

    /// The joined encoder the joined model was fitted on, as the fit wrote it.
    pub fn joined_encoder(&self) -> Option<&str> {
        self.fitted.get("joined")?.get("encoder")?.as_str()
    }

    /// Feature names no model knows: a typo in a weights file.
    pub fn unknown_features(&self) -> Vec<String> {
        [&self.lexical, &self.dense]
            .into_iter()
            .chain(&self.joined)
            .flat_map(|m| m.weights.keys())
            .filter(|name| {
                !FEATURES.contains(&name.as_str()) && !RETIRED.iter().any(|(old, _)| old == name)
            })
            .cloned()
            .collect()
    }
}

/// A model ready to score: weights in feature order.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    pub(crate) bias: f32,
    pub(crate) weights: Row,
    pub(crate) rule: SelectionRule,
}

impl Compiled {
    pub(crate) fn new(model: &Model) -> Compiled {
        Compiled {
            bias: model.bias,
            weights: model.row(),
            rule: model.selection,
        }
    }

    pub(crate) fn probability(&self, row: &Row) -> f32 {
        sigmoid(self.logit(row))
    }

    pub(crate) fn logit(&self, row: &Row) -> f32 {
        self.bias
            + self
                .weights
                .iter()
                .zip(row)
                .map(|(w, x)| w * x)
                .sum::<f32>()
    }

    /// The three features that raised this row's logit most, with their values.
    pub(crate) fn why(&self, row: &Row) -> Why {
        // The three largest contributions, kept in order as the row is read (every
        // sent tool has its why: no sort of the whole row).
        let mut top = [(0.0f32, usize::MAX); 3];
        for (i, (w, x)) in self.weights.iter().zip(row).enumerate() {
            let contribution = w * x;
            if *x == 0.0 || contribution <= 0.0 || contribution <= top[2].0 {
                continue;
            }
            let mut at = 2;
            while at > 0 && contribution > top[at - 1].0 {
                top[at] = top[at - 1];
                at -= 1;
            }
            top[at] = (contribution, i);
        }
        Why::new(
            top.iter()
                .filter(|&&(_, i)| i != usize::MAX)
                .map(|&(_, i)| (i, row[i])),
        )
    }

    /// Writes the features that raised this row's logit most, with their values,
    /// after its probability: a sent tool's reason.
    pub(crate) fn explain_into(&self, reason: &mut String, row: &Row, probability: f32) {
        reason.push_str("p ");
        push_two_decimals(reason, probability);
        let why = self.why(row);
        if !why.is_empty() {
            reason.push_str(": ");
            why.push_to(reason);
        }
    }
}

/// Writes `x` as `format!("{x:.2}")` does (its exact value rounded half to even),
/// without the general float formatting: a selection explains every domain, and on
/// a catalog of thousands of tools that formatting was a tenth of its time.
pub(crate) fn push_two_decimals(out: &mut String, x: f32) {
    use std::fmt::Write as _;
    // Exact: 24 bits of significand times 100 fit in an f64's 53.
    let hundredths = (f64::from(x) * 100.0).round_ties_even();
    if !hundredths.is_finite() || hundredths.abs() >= 1e15 {
        let _ = write!(out, "{x:.2}");
        return;
    }
    if x.is_sign_negative() {
        out.push('-');
    }
    let n = hundredths.abs() as u64;
    // The digits by hand: `write!` costs more than the rest of a reason.
    let mut digits = [0u8; 24];
    let mut start = digits.len();
    let mut rest = n;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        // Two decimals, the point, then at least one integer digit.
        let written = digits.len() - start;
        if written == 2 {
            start -= 1;
            digits[start] = b'.';
        } else if written > 3 && rest == 0 {
            break;
        }
    }
    out.extend(digits[start..].iter().map(|&b| char::from(b)));
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Fits a logistic regression to `rows` and their labels by Newton's method
/// (iteratively reweighted least squares) with an L2 penalty `l2` on the weights
/// (not the bias). Returns the bias and the weights. Deterministic: the same rows
/// give the same weights.
pub fn fit(rows: &[Row], labels: &[bool], l2: f64) -> (f32, Row) {
    fit_parts(&[(rows, labels)], l2)
}

/// [`fit`] on the rows of several parts, as if they were one slice in that order (the
/// folds a held-out fit pools, without copying them).
pub fn fit_parts(parts: &[(&[Row], &[bool])], l2: f64) -> (f32, Row) {
    fit_parts_from(parts, l2, None)
}

/// [`fit_parts`] starting from `start`, a bias and weights near the answer (the fit
/// on every fold, for the fit on all folds but one): the loss has one minimum, so it
/// is the same fit in fewer steps.
pub fn fit_parts_from(
    parts: &[(&[Row], &[bool])],
    l2: f64,
    start: Option<(f32, &Row)>,
) -> (f32, Row) {
    // What history adds may only raise a tool's probability: a learned vote or a
    // companion that counted against a tool would let a history lower recall.
    let mut fixed = [false; N_FEATURES];
    let mut start = start.map(|(bias, weights)| (bias, *weights));
    loop {
        let (bias, weights) = fit_with(parts, l2, &fixed, start);
        start = Some((bias, weights));
        let mut changed = false;
        for i in MONOTONE {
            if weights[i] < 0.0 && !fixed[i] {
                fixed[i] = true;
                changed = true;
            }
        }
        if !changed {
            return (bias, weights);
        }
    }
}

/// The features whose weight may not be negative (see [`fit`]).
const MONOTONE: [usize; 5] = [
    f::LEARNED_TOOL,
    f::LEARNED_DOMAIN,
    f::LEARNED_TOOL_RANK,
    f::COMPANION,
    f::NEXT_STEP,
];

/// [`fit`] with the `fixed` features' weights held at 0, from `start` if given (else
/// from the base rate).
// Matrix code reads best with the indices the formulas use.
#[allow(clippy::needless_range_loop)]
fn fit_with(
    parts: &[(&[Row], &[bool])],
    l2: f64,
    fixed: &[bool; N_FEATURES],
    start: Option<(f32, Row)>,
) -> (f32, Row) {
    let rows_labels = || {
        parts
            .iter()
            .flat_map(|(rows, labels)| rows.iter().zip(labels.iter()))
    };
    const N: usize = N_FEATURES + 1;
    let mut beta = [0.0f64; N];
    // Start at the base rate, so the first step is small.
    let positives = rows_labels().filter(|(_, l)| **l).count() as f64;
    let n_rows = parts.iter().map(|(_, labels)| labels.len()).sum::<usize>() as f64;
    let rate = ((positives + 0.5) / (n_rows + 1.0)).clamp(1e-6, 1.0 - 1e-6);
    beta[0] = (rate / (1.0 - rate)).ln();
    if let Some((bias, weights)) = start {
        beta[0] = f64::from(bias);
        for (i, &w) in weights.iter().enumerate() {
            beta[i + 1] = if fixed[i] { 0.0 } else { f64::from(w) };
        }
    }
    for _ in 0..50 {
        let mut gradient = [0.0f64; N];
        let mut hessian = [[0.0f64; N]; N];
        // The loss at `beta`, summed in the same pass and order as [`loss`] would.
        let mut before = 0.0;
        // A row's nonzero features: most rows have few, and the rest add nothing.
        let mut nonzero = [0usize; N];
        for (row, &label) in rows_labels() {
            let mut x = extended(row);
            for (i, &held) in fixed.iter().enumerate() {
                if held {
                    x[i + 1] = 0.0;
                }
            }
            // A held feature's weight stays 0, so `z` is also what [`loss`] computes.
            let z: f64 = beta.iter().zip(&x).map(|(b, x)| b * x).sum();
            before += softplus(z) - if label { z } else { 0.0 };
            let p = 1.0 / (1.0 + (-z).exp());
            let y = if label { 1.0 } else { 0.0 };
            let w = (p * (1.0 - p)).max(1e-9);
            let mut n = 0;
            for i in 0..N {
                if x[i] != 0.0 {
                    nonzero[n] = i;
                    n += 1;
                }
            }
            for (a, &i) in nonzero[..n].iter().enumerate() {
                gradient[i] += (p - y) * x[i];
                for &j in &nonzero[..=a] {
                    hessian[i][j] += w * x[i] * x[j];
                }
            }
        }
        let before = before + penalty(&beta, l2);
        for i in 0..N {
            for j in 0..i {
                hessian[j][i] = hessian[i][j];
            }
        }
        for i in 1..N {
            gradient[i] += l2 * beta[i];
            hessian[i][i] += l2;
        }
        // A feature that never fires has a zero row: keep its weight at 0.
        for (i, row) in hessian.iter_mut().enumerate() {
            row[i] += 1e-9;
        }
        let Some(step) = solve(hessian, gradient) else {
            break;
        };
        // Damped: halve the step until the penalised loss goes down, so that rows a
        // feature separates perfectly cannot throw the weights off.
        let mut scale = 1.0;
        let mut moved = false;
        for _ in 0..30 {
            let mut trial = beta;
            for i in 0..N {
                trial[i] -= scale * step[i];
            }
            if loss(rows_labels(), &trial, l2) <= before {
                let largest = (0..N).fold(0.0f64, |m, i| m.max((scale * step[i]).abs()));
                beta = trial;
                moved = largest >= 1e-6;
                break;
            }
            scale /= 2.0;
        }
        if !moved {
            break;
        }
    }
    let mut weights = [0.0f32; N_FEATURES];
    for (w, b) in weights.iter_mut().zip(&beta[1..]) {
        *w = *b as f32;
    }
    (beta[0] as f32, weights)
}

/// The negative log-likelihood plus the L2 penalty on the weights.
fn loss<'a>(
    rows_labels: impl Iterator<Item = (&'a Row, &'a bool)>,
    beta: &[f64; N_FEATURES + 1],
    l2: f64,
) -> f64 {
    let mut total = 0.0;
    for (row, &label) in rows_labels {
        let x = extended(row);
        let z: f64 = beta.iter().zip(&x).map(|(b, x)| b * x).sum();
        total += softplus(z) - if label { z } else { 0.0 };
    }
    total + penalty(beta, l2)
}

/// The L2 penalty on the weights (not the bias).
fn penalty(beta: &[f64; N_FEATURES + 1], l2: f64) -> f64 {
    0.5 * l2 * beta[1..].iter().map(|b| b * b).sum::<f64>()
}

/// log(1 + e^z), computed without overflow.
fn softplus(z: f64) -> f64 {
    if z > 0.0 {
        z + (-z).exp().ln_1p()
    } else {
        z.exp().ln_1p()
    }
}

fn extended(row: &Row) -> [f64; N_FEATURES + 1] {
    let mut x = [1.0f64; N_FEATURES + 1];
    for (slot, &v) in x[1..].iter_mut().zip(row) {
        *slot = f64::from(v);
    }
    x
}

/// Solves `a x = b` for a symmetric positive definite `a` by Cholesky; `None` when
/// it is not.
#[allow(clippy::needless_range_loop)]
fn solve<const N: usize>(a: [[f64; N]; N], b: [f64; N]) -> Option<[f64; N]> {
    let mut l = [[0.0f64; N]; N];
    for i in 0..N {
        for j in 0..=i {
            let mut sum = a[i][j];
            for k in 0..j {
                sum -= l[i][k] * l[j][k];
            }
            if i == j {
                if sum <= 0.0 {
                    return None;
                }
                l[i][i] = sum.sqrt();
            } else {
                l[i][j] = sum / l[j][j];
            }
        }
    }
    let mut y = [0.0f64; N];
    for i in 0..N {
        let mut sum = b[i];
        for k in 0..i {
            sum -= l[i][k] * y[k];
        }
        y[i] = sum / l[i][i];
    }
    let mut x = [0.0f64; N];
    for i in (0..N).rev() {
        let mut sum = y[i];
        for k in i + 1..N {
            sum -= l[k][i] * x[k];
        }
        x[i] = sum / l[i][i];
    }
    Some(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Reasons read as they did with `{:.2}`, ties and signs included.
        #[test]
        fn two_decimals_are_what_the_formatter_writes(
            x in prop_oneof![
                any::<f32>(),
                -2.0f32..2.0,
                (-400i32..400).prop_map(|k| k as f32 / 200.0 + 0.005),
                Just(-0.0f32), Just(0.125f32), Just(0.375f32), Just(1e20f32), Just(f32::NAN),
            ]
        ) {
            let mut ours = String::new();
            push_two_decimals(&mut ours, x);
            prop_assert_eq!(ours, format!("{x:.2}"));
        }
    }

    #[test]
    fn the_shipped_weights_parse_and_name_known_features() {
        let weights: Weights =
            serde_json::from_str(include_str!("../weights.json")).expect("weights.json parses");
        assert_eq!(weights.unknown_features(), Vec::<String>::new());
        assert_eq!(FEATURES.len(), N_FEATURES);
    }

    #[test]
    fn a_weights_file_of_an_earlier_version_reads_its_retired_names() {
        let mut model = Model::from_row(-1.0, &[0.0; N_FEATURES], SelectionRule::default());
        model.weights.remove("companion");
        model.weights.insert("prerequisite".to_owned(), 2.0);
        model.weights.insert("co_usage".to_owned(), 0.5);
        model.weights.insert("follows".to_owned(), 0.5);
        model.weights.insert("tool_bm25_rank".to_owned(), 1.5);
        let weights = Weights {
            lexical: model.clone(),
            dense: model.clone(),
            joined: Some(model),
            fitted: serde_json::Value::Null,
        };
        assert_eq!(weights.unknown_features(), Vec::<String>::new());
        let row = weights.lexical.row();
        // Renamed: read as its new name. Merged into another: weighs nothing.
        assert_eq!(row[f::COMPANION], 2.0);
        assert_eq!(row[f::TOOL_BM25_RANK], 1.5);
        assert_eq!(row.iter().sum::<f32>(), 3.5);

        let mut typo = weights.clone();
        typo.dense.weights.insert("companoin".to_owned(), 1.0);
        if let Some(joined) = &mut typo.joined {
            joined.weights.insert("tool_dense3".to_owned(), 1.0);
        }
        assert_eq!(
            typo.unknown_features(),
            vec!["companoin".to_owned(), "tool_dense3".to_owned()]
        );
    }

    #[test]
    fn a_fit_recovers_the_direction_of_a_separating_feature() {
        // Label = feature 0 above 0.5, with some noise from feature 1.
        let mut rows = Vec::new();
        let mut labels = Vec::new();
        for i in 0..400 {
            let mut row = [0.0f32; N_FEATURES];
            row[0] = (i % 20) as f32 / 20.0;
            row[1] = ((i * 7) % 11) as f32 / 11.0;
            labels.push(row[0] + 0.1 * row[1] > 0.55);
            rows.push(row);
        }
        let (bias, weights) = fit(&rows, &labels, 1.0);
        assert!(weights[0] > 1.0, "{weights:?}");
        assert!(bias < 0.0);
        // Features that never fire keep a zero weight.
        assert_eq!(weights[5], 0.0);
        let model = Compiled::new(&Model::from_row(bias, &weights, SelectionRule::default()));
        let mut high = [0.0; N_FEATURES];
        high[0] = 0.95;
        let mut low = [0.0; N_FEATURES];
        low[0] = 0.1;
        assert!(model.probability(&high) > 0.8);
        assert!(model.probability(&low) < 0.2);
    }

    /// A fit started elsewhere ends where a fit from the base rate does, a monotone
    /// feature held at 0 included: the held-out fits start from the fit on every fold.
    #[test]
    fn a_fit_from_another_start_reaches_the_same_weights() {
        let mut rows = Vec::new();
        let mut labels = Vec::new();
        for i in 0..600 {
            let mut row = [0.0f32; N_FEATURES];
            row[0] = (i % 20) as f32 / 20.0;
            row[1] = ((i * 7) % 11) as f32 / 11.0;
            // Against the label: its fitted weight would be negative, so it is held at 0.
            row[f::COMPANION] = ((i * 3) % 5) as f32 / 5.0;
            labels.push(row[0] + 0.3 * row[1] - 0.2 * row[f::COMPANION] > 0.5 || i % 17 == 0);
            rows.push(row);
        }
        let parts = [(&rows[..], &labels[..])];
        let (bias, weights) = fit_parts(&parts, 1.0);
        assert_eq!(weights[f::COMPANION], 0.0, "{weights:?}");
        let mut far = [0.0f32; N_FEATURES];
        far[0] = -3.0;
        far[f::COMPANION] = -2.0;
        for start in [(bias, &weights), (2.0, &far)] {
            let (b, w) = fit_parts_from(&parts, 1.0, Some(start));
            assert!((b - bias).abs() < 1e-4, "{b} against {bias}");
            for (x, y) in w.iter().zip(&weights) {
                assert!((x - y).abs() < 1e-4, "{w:?} against {weights:?}");
            }
        }
    }
}
