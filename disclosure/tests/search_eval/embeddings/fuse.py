"""Psych's lexical ranking fused with an embedding (form E): weight chosen on dev, test
reported once.

Usage: python fuse.py PSYCH_RANKS.json [MODEL]   (MODEL: minilm, the default, or wordllama;
its cache/MODEL__E.npz from embed_cache.py; PSYCH_RANKS.json from
`cargo run --release -p psych-disclosure --example search_ranks -- PSYCH_RANKS.json`)."""
import json, sys
from pathlib import Path
import numpy as np
from common import load_tools, load_queries, evaluate, fmt

tools = load_tools(); queries = load_queries()
idx = {(s, t["name"]): i for i, (s, t) in enumerate(tools)}
psych = json.load(open(sys.argv[1]))
model = sys.argv[2] if len(sys.argv) > 2 else "minilm"
d = np.load(Path(__file__).resolve().parent / "cache" / f"{model}__E.npz"); E, Q = d["E"], d["Q"]
qpos = {q["query"]: i for i, q in enumerate(queries)}
def psych_scores(text):
    s = np.full(len(tools), -np.inf)
    for k, (srv, tool, score) in enumerate(psych[text]):
        s[idx[(srv, tool)]] = score - 1e-9 * k   # keep Psych's own order on ties
    return s
def emb(text):
    q = Q[qpos[text]]; return E @ q / (np.linalg.norm(E, axis=1) * np.linalg.norm(q) + 1e-12)
def fused(w):
    def f(text):
        p = psych_scores(text); fin = np.isfinite(p)
        pn = np.zeros(len(tools))
        if fin.any():
            top = p[fin].max(); pn[fin] = p[fin] / top if top > 0 else 0
        e = emb(text); en = (e - e.min()) / (e.max() - e.min() + 1e-12)
        return (1 - w) * pn + w * en
    return f
def rrf(text, k=60):
    p = psych_scores(text); e = emb(text)
    rp = np.empty(len(tools)); order = np.argsort(-np.where(np.isfinite(p), p, -1e18), kind="stable"); rp[order] = np.arange(1, len(tools)+1)
    re_ = np.empty(len(tools)); order = np.argsort(-e, kind="stable"); re_[order] = np.arange(1, len(tools)+1)
    return 1/(k+rp) + 1/(k+re_)
res, per, _ = evaluate(psych_scores, tools, queries); print(fmt("Psych (lexical, from its top 200)", res))
res, per, _ = evaluate(emb, tools, queries); print(fmt(f"{model} E", res))
best = None
for w in [0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9]:
    r, _, _ = evaluate(fused(w), tools, queries, splits=("dev",))
    print(f"dev w={w}: r@1 {r['dev'][0]:.3f} r@5 {r['dev'][1]:.3f} mrr {r['dev'][2]:.3f}")
    if best is None or r["dev"][2] > best[1]: best = (w, r["dev"][2])
res, per, _ = evaluate(fused(best[0]), tools, queries); print(fmt(f"fused w={best[0]} (dev-chosen by MRR)", res))
for s,(n,r1,r5,m) in per["test"].items(): print("  test", s, n, f"{r1:.2f} {r5:.2f} {m:.2f}")
res, per, _ = evaluate(rrf, tools, queries); print(fmt(f"RRF k=60 Psych+{model}", res))
