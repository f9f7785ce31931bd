"""Qwen2.5-VL's 3-D (temporal, height, width) M-RoPE position ids, on the host (numpy,
no torch), from the token ids and the media grids.

The same numbers as transformers' ``Qwen2_5_VLModel.get_rope_index`` (5.x):

- text tokens count on from the current position, the same value on all three axes;
- an image item of grid (1, h, w) at position s gets (s, s + row, s + col) over its
  (h / merge) x (w / merge) merged tokens, row-major;
- a video item of grid (t, h, w) gets temporal ``s + int(i * tokens_per_second *
  second_per_grid_t)`` for its i-th temporal patch (float32 arithmetic, truncated, as the
  reference computes it), height and width as an image;
- after an item, text continues at s + max(h, w) / merge. (transformers 4.x and Qwen's
  original code continue at the item's largest position + 1 instead, which differs only
  after a video whose temporal extent exceeds its spatial one: ``legacy_text_after_video``);
- padding (attention_mask 0) is skipped and gets position 0;
- the delta for generation is max position + 1 - number of real tokens.

One sample at a time (``sample_mrope_positions``), so a collator computes it per sample
and packing or a context-parallel split slices the [3, S] array like the tokens; the batch
function applies it row by row with the batch's grids in order, as the reference does.
Unlike the reference, items of one kind that touch (no token between them) are split by
their grids' token counts, and a placeholder run that the grids do not cover exactly is a
clear error instead of a shape error.
"""
from __future__ import annotations

import numpy as np

from ...data.records import DataRecordError

TEXT, IMAGE, VIDEO = 0, 1, 2


def _grid_list(grid_thw) -> list[tuple[int, int, int]]:
    if grid_thw is None:
        return []
    arr = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    return [tuple(int(v) for v in row) for row in arr]


def _float_list(values, n: int) -> list[float]:
    if values is None:
        return [1.0] * n  # the reference's default when second_per_grid_ts is not given
    out = [float(v) for v in np.asarray(values, dtype=np.float64).reshape(-1)]
    if len(out) < n:
        raise DataRecordError(f"second_per_grid_ts has {len(out)} entries for {n} videos")
    return out


def _runs(kinds: np.ndarray):
    """(kind, start, end) of each maximal run of equal token kinds."""
    if kinds.size == 0:
        return
    edges = np.flatnonzero(np.diff(kinds)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [kinds.size]])
    for s, e in zip(starts.tolist(), ends.tolist()):
        yield int(kinds[s]), s, e


def _vision_positions(start: int, grid, merge: int, interval: np.float32 | None) -> np.ndarray:
    """[3, t*h*w/merge^2] positions of one item starting at ``start``."""
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    if interval is None:  # image: no temporal spacing
        temporal = np.arange(t, dtype=np.int64)
    else:  # float32 product, truncated toward zero (the reference's tensor arithmetic)
        temporal = (np.arange(t, dtype=np.float32) * interval).astype(np.int64)
    pos = np.empty((3, t, h, w), dtype=np.int64)
    pos[0] = temporal[:, None, None] + start
    pos[1] = np.arange(h, dtype=np.int64)[None, :, None] + start
    pos[2] = np.arange(w, dtype=np.int64)[None, None, :] + start
    return pos.reshape(3, -1)


def token_kinds(input_ids, image_token_id: int, video_token_id: int) -> np.ndarray:
    """0 text, 1 image placeholder, 2 video placeholder (transformers' mm_token_type_ids)."""
    ids = np.asarray(input_ids)
    return np.where(ids == image_token_id, IMAGE,
                    np.where(ids == video_token_id, VIDEO, TEXT)).astype(np.int64)


def sample_mrope_positions(input_ids, *, image_token_id: int, video_token_id: int,
                           image_grid_thw=None, video_grid_thw=None, second_per_grid_ts=None,
                           attention_mask=None, spatial_merge_size: int = 2,
                           tokens_per_second: float, legacy_text_after_video: bool = False,
                           context: str = "sample") -> tuple[np.ndarray, int]:
    """Positions [3, S] int64 and the generation delta of one sample.

    ``image_grid_thw`` / ``video_grid_thw``: this sample's items in order ([n, 3]);
    ``second_per_grid_ts``: one entry per video. Every grid must be used, every placeholder
    covered; otherwise a DataRecordError naming ``context``.
    """
    ids = np.asarray(input_ids).reshape(-1)
    seq = ids.size
    keep = np.ones(seq, dtype=bool) if attention_mask is None else \
        np.asarray(attention_mask).reshape(-1).astype(bool)
    if keep.size != seq:
        raise DataRecordError(f"{context}: attention_mask has {keep.size} entries for "
                              f"{seq} tokens")
    kinds = token_kinds(ids[keep], image_token_id, video_token_id)
    grids = {IMAGE: _grid_list(image_grid_thw), VIDEO: _grid_list(video_grid_thw)}
    seconds = _float_list(second_per_grid_ts, len(grids[VIDEO]))
    used = {IMAGE: 0, VIDEO: 0}
    merge = spatial_merge_size
    pieces, current = [], 0
    for kind, start, end in _runs(kinds):
        if kind == TEXT:
            pieces.append(np.broadcast_to(np.arange(current, current + end - start,
                                                    dtype=np.int64), (3, end - start)))
            current += end - start
            continue
        name = "image" if kind == IMAGE else "video"
        covered = start
        while covered < end:  # one or more touching items of this kind
            n = used[kind]
            if n >= len(grids[kind]):
                raise DataRecordError(
                    f"{context}: {name} placeholder tokens at positions {covered}..{end - 1} "
                    f"have no {name} grid left ({len(grids[kind])} given)")
            grid = grids[kind][n]
            if grid[1] % merge or grid[2] % merge:
                raise DataRecordError(f"{context}: {name} {n} grid {grid} is not a multiple "
                                      f"of the merge size {merge}")
            count = grid[0] * (grid[1] // merge) * (grid[2] // merge)
            if covered + count > end:
                raise DataRecordError(
                    f"{context}: {name} {n} with grid {grid} needs {count} placeholder "
                    f"tokens but only {end - covered} follow at position {covered}")
            interval = None
            if kind == VIDEO:
                interval = np.float32(np.float32(tokens_per_second) * np.float32(seconds[n]))
            pos = _vision_positions(current, grid, merge, interval)
            pieces.append(pos)
            if kind == VIDEO and legacy_text_after_video:
                current = int(pos.max()) + 1
            else:
                current += max(grid[1], grid[2]) // merge
            used[kind] += 1
            covered += count
    for kind, name in ((IMAGE, "image"), (VIDEO, "video")):
        if used[kind] != len(grids[kind]):
            raise DataRecordError(f"{context}: {len(grids[kind])} {name} grids given but the "
                                  f"tokens hold placeholders for {used[kind]}")
    positions = np.zeros((3, seq), dtype=np.int64)
    if pieces:
        kept = np.concatenate(pieces, axis=1)
        positions[:, keep] = kept
        delta = int(kept.max()) + 1 - int(keep.sum())
    else:
        delta = 0
    return positions, delta


def batch_mrope_positions(input_ids, *, image_token_id: int, video_token_id: int,
                          image_grid_thw=None, video_grid_thw=None, second_per_grid_ts=None,
                          attention_mask=None, spatial_merge_size: int = 2,
                          tokens_per_second: float, legacy_text_after_video: bool = False,
                          context: str = "batch") -> tuple[np.ndarray, np.ndarray]:
    """Positions [3, B, S] and ``mrope_position_deltas`` [B, 1] of a batch whose grids
    list all its items in row order (the Hugging Face batch layout)."""
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {list(ids.shape)}")
    mask = None if attention_mask is None else np.asarray(attention_mask).astype(bool)
    images, videos = _grid_list(image_grid_thw), _grid_list(video_grid_thw)
    seconds = _float_list(second_per_grid_ts, len(videos))
    merge = spatial_merge_size
    positions = np.zeros((3, *ids.shape), dtype=np.int64)
    deltas = np.zeros((ids.shape[0], 1), dtype=np.int64)
    next_image = next_video = 0
    for b in range(ids.shape[0]):
        row_mask = None if mask is None else mask[b]
        kinds = token_kinds(ids[b] if row_mask is None else ids[b][row_mask],
                            image_token_id, video_token_id)
        # This row's items: as many grids as its placeholder tokens cover.
        n_img = _items_covering(int((kinds == IMAGE).sum()), images[next_image:], merge)
        n_vid = _items_covering(int((kinds == VIDEO).sum()), videos[next_video:], merge)
        positions[:, b], deltas[b, 0] = sample_mrope_positions(
            ids[b], image_token_id=image_token_id, video_token_id=video_token_id,
            image_grid_thw=images[next_image:next_image + n_img] or None,
            video_grid_thw=videos[next_video:next_video + n_vid] or None,
            second_per_grid_ts=seconds[next_video:next_video + n_vid],
            attention_mask=row_mask, spatial_merge_size=merge,
            tokens_per_second=tokens_per_second,
            legacy_text_after_video=legacy_text_after_video, context=f"{context} row {b}")
        next_image += n_img
        next_video += n_vid
    for name, used, given in (("image", next_image, images), ("video", next_video, videos)):
        if used != len(given):
            raise DataRecordError(f"{context}: {len(given)} {name} grids given but the "
                                  f"batch's tokens hold placeholders for {used}")
    return positions, deltas


def _items_covering(tokens: int, grids, merge: int) -> int:
    """How many of ``grids`` (from the first) a row's ``tokens`` placeholders hold; the
    per-sample function then checks that they match run by run."""
    n = total = 0
    while total < tokens and n < len(grids):
        t, h, w = grids[n]
        total += t * (h // merge) * (w // merge)
        n += 1
    return n
