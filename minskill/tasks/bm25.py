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
with q scores 0. BM25Index holds a pool indexed once, for a retriever that answers many queries
(tasks/retriever_server.py); bm25_scores and top_documents are it, built for one query.
"""
from __future__ import annotations

import heapq
import math
import re
from collections import Counter

__all__ = ["tokens", "bm25_scores", "top_documents", "BM25Index", "BM25_K1", "BM25_B",
           "STOP_WORDS"]

BM25_K1, BM25_B = 1.2, 0.75
STOP_WORDS = frozenset("a an and are as at be by for from how in is it of on or that the this to "
                       "what when which with you your use".split())


def tokens(text: str) -> list[str]:
    """Lower-cased runs of letters and digits (any script), stop words left out."""
    return [t for t in re.findall(r"[^\W_]+", text.lower()) if t not in STOP_WORDS]


def bm25_scores(query: str, documents: list[str], k1: float = BM25_K1,
                b: float = BM25_B) -> list[float]:
    """BM25 score of each document for the query (module docstring), the pool being `documents`."""
    index = BM25Index(documents, k1, b)
    scores = [0.0] * len(documents)
    for i, score in index.scores(query).items():
        scores[i] = score
    return scores


def top_documents(query: str, documents: list[str], k: int) -> list[int]:
    """Indices of the (at most) k best documents for the query, best first; documents scoring 0 are
    left out and equal scores keep the pool's order."""
    return [i for i, _ in BM25Index(documents).top(query, k)]


class BM25Index:
    """A pool of documents indexed once for many queries (a retriever serving a corpus: each query
    costs the postings of its terms, not a pass over the pool). The scores are bm25_scores's to the
    bit: each document adds its terms' parts in the same order, the query's terms in order of first
    appearance (not a set's, which differs between processes)."""

    def __init__(self, documents: list[str], k1: float = BM25_K1, b: float = BM25_B):
        self.k1, self.b, self.size = k1, b, len(documents)
        self.lengths: list[int] = []
        self.postings: dict[str, list[tuple[int, int]]] = {}   # term -> (document, count)
        for i, document in enumerate(documents):
            counts = Counter(tokens(document))
            self.lengths.append(sum(counts.values()))
            for term, count in counts.items():
                self.postings.setdefault(term, []).append((i, count))
        self.avgdl = sum(self.lengths) / self.size if self.size else 1.0
        self.avgdl = self.avgdl or 1.0

    def scores(self, query: str) -> dict[int, float]:
        """The score of each document sharing a word with the query (the others score 0)."""
        scores: dict[int, float] = {}
        k1, b = self.k1, self.b
        for term in dict.fromkeys(tokens(query)):
            postings = self.postings.get(term, ())
            if not postings:
                continue
            idf = math.log(1 + (self.size - len(postings) + 0.5) / (len(postings) + 0.5))
            for i, f in postings:
                part = idf * f * (k1 + 1) / (f + k1 * (1 - b + b * self.lengths[i] / self.avgdl))
                scores[i] = scores.get(i, 0.0) + part
        return scores

    def top(self, query: str, k: int) -> list[tuple[int, float]]:
        """(index, score) of the (at most) k best documents scoring above 0, best first; equal
        scores keep the pool's order."""
        scored = [(i, s) for i, s in self.scores(query).items() if s > 0]
        return heapq.nsmallest(max(k, 0), scored, key=lambda item: (-item[1], item[0]))
