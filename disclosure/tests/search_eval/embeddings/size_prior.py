"""Psych's scores times (tools of the tool's server)^-beta: a prior that a query is as
likely for each server, whatever its size. Dev only.

Usage: python size_prior.py PSYCH_RANKS.json"""
import json
import sys
from collections import Counter

import numpy as np

from common import evaluate, load_queries, load_tools

tools, queries = load_tools(), load_queries()
idx = {(s, t["name"]): i for i, (s, t) in enumerate(tools)}
size = Counter(s for s, _ in tools)
psych = json.load(open(sys.argv[1]))


def scores(beta):
    def f(text):
        s = np.full(len(tools), -np.inf)
        for k, (srv, tool, score) in enumerate(psych[text]):
            s[idx[(srv, tool)]] = score * size[srv] ** -beta - 1e-9 * k
        return s
    return f


for beta in [0, 0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.15]:
    r = evaluate(scores(beta), tools, queries, splits=("dev",))[0]["dev"]
    print(f"beta {beta}: {r[0]:.3f} / {r[1]:.3f} / {r[2]:.3f}")
