"""Mask families for measuring CP balance (Cornstarch's benchmark masks), as mask codes.

- ``causal``: one text document;
- ``prefix_lm``: a bidirectional prefix of 10-100% of the sequence, causal after it;
- ``encoder_embedded``: a causal text span of 10-30%, then bidirectional media blocks of
  S/64..S/16 tokens alternating with causal text spans until 90%, then text;
- ``packed``: four documents of S/10..S/4 tokens (scaled to fill S), each one of the
  three above, never attending to each other.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np

from ..plan.context_parallel.attention_mask import encode


def causal(s: int, rng: np.random.Generator) -> np.ndarray:
    return np.zeros(s, np.int64)


def prefix_lm(s: int, rng: np.random.Generator) -> np.ndarray:
    item = np.zeros(s, np.int64)
    item[:int(rng.uniform(0.1, 1.0) * s)] = 1
    return item


def encoder_embedded(s: int, rng: np.random.Generator) -> np.ndarray:
    item = np.zeros(s, np.int64)
    pos, n = int(rng.uniform(0.1, 0.3) * s), 0
    while pos < 0.9 * s:
        size = int(rng.integers(max(1, s // 64), max(2, s // 16)))
        n += 1
        item[pos:min(pos + size, s)] = n
        pos += size + int(rng.integers(max(1, s // 64), max(2, s // 16)))  # a text span
    return item


def packed(s: int, rng: np.random.Generator) -> np.ndarray:
    sizes = rng.integers(max(1, s // 10), max(2, s // 4), size=4).astype(float)
    ends = np.round(np.cumsum(sizes / sizes.sum()) * s).astype(int)
    doc, item, start, offset = np.zeros(s, np.int64), np.zeros(s, np.int64), 0, 0
    for d, end in enumerate(ends):
        family = [causal, prefix_lm, encoder_embedded][int(rng.integers(3))]
        items = family(end - start, rng)
        doc[start:end] = d
        item[start:end] = np.where(items > 0, items + offset, 0)
        offset += int(items.max(initial=0))
        start = end
    return encode(doc, item)


FAMILIES: Dict[str, Callable[[int, np.random.Generator], np.ndarray]] = {
    "causal": causal, "prefix_lm": prefix_lm, "encoder_embedded": encoder_embedded,
    "packed": packed,
}


def family_codes(name: str, s: int, seed: int = 0) -> np.ndarray:
    """Mask codes of ``name`` for a sequence of ``s`` tokens (deterministic in ``seed``)."""
    rng = np.random.default_rng(seed)
    codes = FAMILIES[name](s, rng)
    return codes if name == "packed" else encode(np.zeros(s, np.int64), codes)
