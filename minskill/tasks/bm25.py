"""Okapi BM25, the one implementation of the project: skill retrieval (minskill/retrieval.py) ranks
skills with it, the `webshop` suite its catalogue and the `searchqa` suite its corpus. Standard
library only, so tasks/ copies alone.

    tokens(x)   = lower-cased runs of letters and digits of x (any script), minus a short list of
                  stop words
    score(q, d) = Σ_{t ∈ set(tokens(q))} IDF(t) · f(t,d)·(k1 + 1)
                  / (f(t,d) + k1·(1 − b + b·|d| / avgdl))
    IDF(t)      = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5))

f(t,d): count of t in tokens(d); |d| = len(tokens(d)); avgdl: mean |d| over the pool of N documents;
n(t): documents of the pool that hold t; k1 = 1.2, b = 0.75 by default. A document sharing no word
with q scores 0.
"""
from __future__ import annotations

import math
import re
from collections import Counter

__all__ = ["tokens", "bm25_scores", "top_documents", "BM25_K1", "BM25_B", "STOP_WORDS"]

BM25_K1, BM25_B = 1.2, 0.75
STOP_WORDS = frozenset("a an and are as at be by for from how in is it of on or that the this to "
                       "what when which with you your use".split())


def tokens(text: str) -> list[str]:
    """Lower-cased runs of letters and digits (any script), stop words left out."""
    return [t for t in re.findall(r"[^\W_]+", text.lower()) if t not in STOP_WORDS]


def bm25_scores(query: str, documents: list[str], k1: float = BM25_K1,
                b: float = BM25_B) -> list[float]:
    """BM25 score of each document for the query (module docstring), the pool being `documents`."""
    docs = [Counter(tokens(d)) for d in documents]
    if not docs:
        return []
    lengths = [sum(d.values()) for d in docs]
    avgdl = sum(lengths) / len(docs) or 1.0
    scores = [0.0] * len(docs)
    for term in set(tokens(query)):
        having = sum(1 for d in docs if term in d)
        if not having:
            continue
        idf = math.log(1 + (len(docs) - having + 0.5) / (having + 0.5))
        for i, d in enumerate(docs):
            f = d.get(term, 0)
            if f:
                scores[i] += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * lengths[i] / avgdl))
    return scores


def top_documents(query: str, documents: list[str], k: int) -> list[int]:
    """Indices of the (at most) k best documents for the query, best first; documents scoring 0 are
    left out and equal scores keep the pool's order."""
    scores = bm25_scores(query, documents)
    order = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: -scores[i])
    return order[:k]
