"""The distilled static table (distill.py) alone and fused with Psych's ranking, over a grid
of settings on dev: row mode (mean, tok), PCA dimensions (none, 256, 128), token weights
(none; IDF over the catalogue's tool texts; log(1 + id) past id 999, a Zipf stand-in), text
form (E, A of forms.py), fusion weight 0.1 to 0.4 (as fuse.py: max-normalised Psych, min-max
normalised cosine).

Usage: python static_eval.py PSYCH_RANKS.json            (the dev grid)
       python static_eval.py PSYCH_RANKS.json MODE DIMS WEIGHT FORM W
                                                        (one setting, dev and test)"""
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from common import evaluate, fmt, load_queries, load_tools
from forms import make_forms
from minilm_np import DIR

CACHE = Path(__file__).resolve().parent / "cache"
tools, queries = load_tools(), load_queries()
forms = {k.split()[0]: f for k, f in make_forms(tools).items()}
tok = Tokenizer.from_file(str(DIR / "tokenizer.json"))
idx = {(s, t["name"]): i for i, (s, t) in enumerate(tools)}
psych = json.load(open(sys.argv[1]))
qpos = {q["query"]: i for i, q in enumerate(queries)}


def ids(texts):
    return [e.ids[1:-1] for e in tok.encode_batch(list(texts))]


qids = ids([q["query"] for q in queries])


def psych_scores(text):
    s = np.full(len(tools), -np.inf)
    for k, (srv, tool, score) in enumerate(psych[text]):
        s[idx[(srv, tool)]] = score - 1e-9 * k
    return s


def build(mode, dims, weight, form):
    X = np.load(CACHE / f"static_{mode}.npy")
    if dims:
        X = X - X.mean(0)
        X = X @ np.linalg.svd(X, full_matrices=False)[2][:dims].T
    tids = ids([forms[form](s, t) for s, t in tools])
    df = Counter()
    for r in tids:
        df.update(set(r))
    n = len(tids)

    def w(i):
        if weight == "idf":
            return math.log(1 + (n - df[i] + 0.5) / (df[i] + 0.5))
        if weight == "zipf":
            return math.log(1 + i) if i > 999 else 1.0
        return 1.0

    def emb(r):
        if not r:
            return np.zeros(X.shape[1])
        ws = np.array([w(i) for i in r])
        v = (X[r] * ws[:, None]).sum(0) / ws.sum()
        return v / (np.linalg.norm(v) + 1e-12)

    return np.stack([emb(r) for r in tids]), np.stack([emb(r) for r in qids])


def alone(E, Q):
    return lambda text: E @ Q[qpos[text]]


def fused(E, Q, wt):
    def f(text):
        p = psych_scores(text)
        fin = np.isfinite(p)
        pn = np.zeros(len(tools))
        if fin.any():
            top = p[fin].max()
            pn[fin] = p[fin] / top if top > 0 else 0
        e = E @ Q[qpos[text]]
        return (1 - wt) * pn + wt * (e - e.min()) / (e.max() - e.min() + 1e-12)
    return f


if len(sys.argv) > 2:
    mode, dims, weight, form, wt = sys.argv[2:7]
    E, Q = build(mode, int(dims), weight, form)
    print(fmt("Psych", evaluate(psych_scores, tools, queries)[0]))
    print(fmt(f"static {mode} d{dims} {weight} {form}", evaluate(alone(E, Q), tools, queries)[0]))
    print(fmt(f"fused w{wt}", evaluate(fused(E, Q, float(wt)), tools, queries)[0]))
    sys.exit()
dev = ("dev",)
for mode in ["mean", "tok"]:
    for dims in [0, 256, 128]:
        for weight in ["none", "idf", "zipf"]:
            for form in ["E", "A"]:
                E, Q = build(mode, dims, weight, form)
                a = evaluate(alone(E, Q), tools, queries, splits=dev)[0]["dev"]
                b = max(((wt,) + evaluate(fused(E, Q, wt), tools, queries, splits=dev)[0]["dev"]
                         for wt in [0.1, 0.2, 0.3, 0.4]), key=lambda x: x[3])
                print(f"{mode} d{dims} {weight} {form}: alone {a[0]:.3f}/{a[1]:.3f}/{a[2]:.3f}"
                      f"  fused w{b[0]} {b[1]:.3f}/{b[2]:.3f}/{b[3]:.3f}", flush=True)
