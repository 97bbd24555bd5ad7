"""Shared data loading, metrics and BM25 for the embedding-vs-lexical measurement.

Mirrors disclosure/tests/search_eval.rs: the five fixtures under the server names they are
connected as (tests/common/mod.rs FIXTURES) plus every catalogs/<server>.tools.json, all 3,101
tools sorted by (server, tool); ties broken by (server, tool).
"""
import json
import math
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

EVAL = Path(__file__).resolve().parent.parent
FIXDIR = EVAL.parents[3] / "shared/fixtures/catalogs"
FIXTURES = [
    ("github", "github.tools.json"),
    ("notion", "notion.tools.json"),
    ("playwright", "playwright.tools.json"),
    ("filesystem", "server-filesystem.tools.json"),
    ("memory", "server-memory.tools.json"),
]


def load_tools():
    files = {s: FIXDIR / f for s, f in FIXTURES}
    for p in sorted((EVAL / "catalogs").glob("*.tools.json")):
        s = p.name[: -len(".tools.json")]
        assert s not in files
        files[s] = p
    tools = []
    for s, p in files.items():
        for t in json.loads(p.read_text())["tools"]:
            tools.append((s, t))
    tools.sort(key=lambda x: (x[0], x[1]["name"]))
    assert len(tools) == 3101, len(tools)
    assert len({(s, t["name"]) for s, t in tools}) == 3101
    return tools


def load_queries():
    qs = json.loads((EVAL / "queries.json").read_text())
    assert len(qs) == 281
    return qs


def rank_of(scores, gold_idx):
    """1-based rank of gold in a descending ranking of `scores` (ties: lower index first,
    tools being sorted by (server, tool)). None if the gold scores -inf (absent)."""
    g = scores[gold_idx]
    if not np.isfinite(g):
        return None
    better = np.sum(scores > g)
    ties_before = np.sum(scores[:gold_idx] == g)
    return int(better + ties_before + 1)


def metrics(ranks):
    n = len(ranks)
    r1 = sum(1 for r in ranks if r is not None and r <= 1) / n
    r5 = sum(1 for r in ranks if r is not None and r <= 5) / n
    mrr = sum(1.0 / r for r in ranks if r is not None) / n
    return r1, r5, mrr


def evaluate(score_fn, tools, queries, splits=("dev", "test")):
    """score_fn(query_text) -> np.array of len(tools) (higher better, -inf = absent).
    Returns {split: (r1, r5, mrr)}, per-server {split: {server: (n, r1, r5, mrr)}}, ranks."""
    idx = {(s, t["name"]): i for i, (s, t) in enumerate(tools)}
    out, per, ranks = {}, {}, {}
    for split in splits:
        rs, bys = [], defaultdict(list)
        for q in queries:
            if q["split"] != split:
                continue
            r = rank_of(score_fn(q["query"]), idx[(q["server"], q["tool"])])
            rs.append(r)
            bys[q["server"]].append(r)
            ranks[q["query"]] = r
        out[split] = metrics(rs)
        per[split] = {s: (len(v),) + metrics(v) for s, v in sorted(bys.items())}
    return out, per, ranks


def fmt(name, res):
    d, t = res["dev"], res["test"]
    return (f"| {name} | {d[0]:.3f} | {d[1]:.3f} | {d[2]:.3f} | "
            f"{t[0]:.3f} | {t[1]:.3f} | {t[2]:.3f} |")


# ---------------------------------------------------------------- BM25

def plain_words(text):
    """The scorer's tests/common/bm25.rs: split at non-alphanumerics, lowercase."""
    return [w.lower() for w in re.split(r"[^0-9A-Za-z\u00C0-\uFFFF]+", text) if w]


_camel = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def split_words(text):
    """The brief's tokenisation: split on _ - . and any non-alphanumeric, then camelCase."""
    out = []
    for w in re.split(r"[^0-9A-Za-z]+", text):
        if not w:
            continue
        for p in _camel.split(w):
            if p:
                out.append(p.lower())
    return out


def name_and_description(t):
    return f"{t['name']} {t.get('description') or ''}"


class BM25:
    def __init__(self, texts, tok, k1=1.2, b=0.75):
        self.tok, self.k1, self.b = tok, k1, b
        self.tfs = [Counter(tok(x)) for x in texts]
        self.lens = np.array([sum(c.values()) for c in self.tfs], dtype=float)
        self.avg = self.lens.mean()
        self.df = Counter()
        for c in self.tfs:
            self.df.update(c.keys())
        self.n = len(texts)
        self.post = defaultdict(list)
        for i, c in enumerate(self.tfs):
            for w, f in c.items():
                self.post[w].append((i, f))

    def scores(self, query):
        s = np.zeros(self.n)
        for w in set(self.tok(query)):
            if w not in self.df:
                continue
            df = self.df[w]
            idf = math.log(1 + (self.n - df + 0.5) / (df + 0.5))
            for i, f in self.post[w]:
                s[i] += idf * f * (self.k1 + 1) / (
                    f + self.k1 * (1 - self.b + self.b * self.lens[i] / self.avg))
        s[s <= 0] = -np.inf  # the scorer's BM25 returns only tools sharing a word
        return s
