"""The compact multimodal attention mask: one int64 per token instead of an S x S matrix.

A token's code is ``doc << 32 | item``: ``doc`` numbers the packed sample (document) it
belongs to, ``item`` is 0 for a text token and the media item's number (1, 2, ...) for a
token of an image (or any other media item). The rule, for query q and key k:

    allowed(q, k) = doc(q) == doc(k) and (k <= q            if item(q) == 0   (text)
                                          item(k) == item(q) otherwise        (media))

Text attends causally to everything before it in its document, media included; a media
token attends bidirectionally to the tokens of its own item and nothing else (Cornstarch's
bitfield rule, made stricter: two images, or two packed samples, never see each other).
Because documents and items are contiguous spans, every query row attends one contiguous
key interval ``[lo, hi]``: that is what makes tile counts and the CP attention cheap.
Pure numpy (no torch): the planner and the runtime read the same codes.
"""

from __future__ import annotations

from typing import Mapping, Optional, Tuple

import numpy as np

DOC_SHIFT = 32
ITEM_MASK = (1 << DOC_SHIFT) - 1
MEDIA_ATTENTION = ("causal", "bidirectional")


def encode(doc: np.ndarray, item: np.ndarray) -> np.ndarray:
    return (np.asarray(doc, np.int64) << DOC_SHIFT) | np.asarray(item, np.int64)


def decode(codes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    codes = np.asarray(codes, np.int64)
    return codes >> DOC_SHIFT, codes & ITEM_MASK


def media_items(tokens: np.ndarray, media_tokens: Mapping[int, int]) -> np.ndarray:
    """Item number per token (0 for text) of one sequence: each run of a media placeholder
    id ``t`` is cut into items of ``media_tokens[t]`` tokens (adjacent images stay apart)."""
    tokens = np.asarray(tokens)
    item = np.zeros(len(tokens), np.int64)
    next_item, i = 1, 0
    while i < len(tokens):
        per_item = media_tokens.get(int(tokens[i]))
        if per_item is None:
            i += 1
            continue
        j = i
        while j < len(tokens) and tokens[j] == tokens[i]:
            j += 1
        offsets = np.arange(j - i)
        item[i:j] = next_item + offsets // per_item
        next_item += -(-(j - i) // per_item)
        i = j
    return item


def mask_codes(tokens: np.ndarray, media_tokens: Mapping[int, int],
               doc_ids: Optional[np.ndarray] = None,
               media_attention: str = "bidirectional") -> np.ndarray:
    """Codes of a [S] or [B, S] token array. ``media_tokens``: placeholder id -> tokens per
    item; ``doc_ids``: packed-sample number per token (None: one document per row);
    ``media_attention="causal"`` treats media like text (plain causal, per document)."""
    if media_attention not in MEDIA_ATTENTION:
        raise ValueError(f"--media-attention must be one of {MEDIA_ATTENTION}, "
                         f"got {media_attention!r}")
    tokens = np.asarray(tokens)
    if tokens.ndim == 2:
        docs = [None] * len(tokens) if doc_ids is None else list(np.asarray(doc_ids))
        return np.stack([mask_codes(t, media_tokens, d, media_attention)
                         for t, d in zip(tokens, docs)])
    doc = np.zeros(len(tokens), np.int64) if doc_ids is None else np.asarray(doc_ids)
    item = (media_items(tokens, media_tokens) if media_attention == "bidirectional"
            else np.zeros(len(tokens), np.int64))
    return encode(doc, item)


def key_intervals(codes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(lo, hi): the inclusive key interval each query row of one sequence attends."""
    codes = np.asarray(codes, np.int64)
    s = len(codes)
    doc, item = decode(codes)
    pos = np.arange(s)
    # Start and end of the run of equal values each position lies in.
    doc_start = _run_start(doc)
    run_start, run_end = _run_start(codes), _run_end(codes)
    text = item == 0
    lo = np.where(text, doc_start, run_start)
    hi = np.where(text, pos, run_end)
    return lo, hi


def dense_allowed(codes: np.ndarray) -> np.ndarray:
    """The reference: [S, S] (or [B, S, S]) bool, True where query row may attend key
    column, straight from the rule above."""
    codes = np.asarray(codes, np.int64)
    if codes.ndim == 2:
        return np.stack([dense_allowed(c) for c in codes])
    doc, item = decode(codes)
    pos = np.arange(len(codes))
    same_doc = doc[:, None] == doc[None, :]
    causal = pos[None, :] <= pos[:, None]
    same_item = item[:, None] == item[None, :]
    return same_doc & np.where((item == 0)[:, None], causal, same_item)


def tile_map(codes: np.ndarray, block: int) -> np.ndarray:
    """[nb, nb] bool: query block i computes key tile j (some allowed pair inside it);
    from the row intervals, without the S x S matrix. A [B, S] input gives [B, nb, nb]."""
    codes = np.asarray(codes, np.int64)
    if codes.ndim == 2:
        return np.stack([tile_map(c, block) for c in codes])
    s = len(codes)
    nb = -(-s // block)
    lo, hi = key_intervals(codes)
    qb = np.arange(s) // block
    # Per query block, a difference array over key tiles marks every row's interval.
    diff = np.zeros((nb, nb + 1), np.int64)
    np.add.at(diff, (qb, lo // block), 1)
    np.add.at(diff, (qb, hi // block + 1), -1)
    return np.cumsum(diff[:, :nb], axis=1) > 0


def _run_start(values: np.ndarray) -> np.ndarray:
    change = np.ones(len(values), bool)
    change[1:] = values[1:] != values[:-1]
    return np.maximum.accumulate(np.where(change, np.arange(len(values)), 0))


def _run_end(values: np.ndarray) -> np.ndarray:
    return len(values) - 1 - _run_start(values[::-1])[::-1]
