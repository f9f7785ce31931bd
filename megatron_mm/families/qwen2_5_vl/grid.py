"""Host-side layout of a Qwen2.5-VL vision batch, from the per-item grids (t, h, w).

The grids are host metadata (they come with the batch, like sequence lengths): every index
and mask the encoder needs is built here on the CPU from Python ints, then moved to the
device once, so the forward never reads a device value back.

Order of the patches, as Qwen2-VL's image processor emits them and Hugging Face's
``Qwen2_5_VisionTransformerPretrainedModel`` consumes them: items in batch order, frames in
time order, and within a frame the 2x2 merge units row-major, the 4 patches of a unit
row-major. Window attention then permutes whole merge units so that each window (of
``window_size`` pixels, per frame) is contiguous (``window_index``, Hugging Face's
``get_vision_window_index``); the output is put back in merge-unit order at the end.
Attention segments, in the permuted order: one per window (window layers) or one per frame
(the full-attention layers): Qwen2.5-VL attends within a frame, never across frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

Grid = Tuple[int, int, int]


def host_grids(grid_thw) -> List[Grid]:
    """The grids as Python ints. A tensor must be on the CPU: reading a device tensor here
    would stall the device (a host sync) in every step."""
    if isinstance(grid_thw, torch.Tensor):
        if grid_thw.device.type != "cpu":
            raise ValueError("grid_thw must be host metadata (a list of (t, h, w) or a CPU "
                             f"tensor), got a tensor on {grid_thw.device}: keep the batch's "
                             "grids on the CPU")
        grid_thw = grid_thw.tolist()
    grids = [tuple(int(v) for v in g) for g in grid_thw]
    if not grids or any(len(g) != 3 for g in grids):
        raise ValueError(f"grid_thw must be a non-empty list of (t, h, w), got {grid_thw!r}")
    return grids


@dataclass
class VisionGridLayout:
    """Index tensors (host) of one batch of grids; see the module docstring."""

    grids: List[Grid]
    num_patches: int
    window_index: torch.Tensor  # [units] long: permuted position -> merge unit
    reverse_index: torch.Tensor  # [units] long: merge unit -> permuted position
    positions: torch.Tensor  # [patches, 2] long: (row, col) of each patch, permuted order
    window_seqlens: List[int]  # attention segments of window layers, permuted order
    frame_seqlens: List[int]  # attention segments of full-attention layers

    @property
    def cu_window_seqlens(self) -> torch.Tensor:
        return _cumulative(self.window_seqlens)

    @property
    def cu_frame_seqlens(self) -> torch.Tensor:
        return _cumulative(self.frame_seqlens)


def _cumulative(seqlens: Sequence[int]) -> torch.Tensor:
    out = torch.zeros(len(seqlens) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(seqlens, dtype=torch.long).cumsum(0)
    return out


def vision_grid_layout(grid_thw, spatial_merge_size: int = 2, window_size: int = 112,
                       patch_size: int = 14) -> VisionGridLayout:
    """The layout of ``grid_thw`` (host). ``window_size`` is in pixels, as Hugging Face's
    config gives it: a window spans ``window_size // patch_size // spatial_merge_size``
    merge units per side."""
    grids = host_grids(grid_thw)
    m = spatial_merge_size
    unit = m * m
    per_side = window_size // m // patch_size
    if per_side < 1:
        raise ValueError(f"window_size {window_size} is smaller than one merge unit "
                         f"({m} x {patch_size} pixels)")
    window_index, positions, window_seqlens, frame_seqlens = [], [], [], []
    offset = 0
    for t, h, w in grids:
        if t < 1 or h % m or w % m or h < m or w < m:
            raise ValueError(f"grid (t, h, w) = {(t, h, w)}: h and w must be positive "
                             f"multiples of the spatial merge size {m}, t >= 1")
        uh, uw = h // m, w // m
        # (row, col) of each patch in merge-unit order, then permuted with the units.
        rows = torch.arange(h).reshape(uh, m, 1, 1).expand(uh, m, uw, m)
        cols = torch.arange(w).reshape(1, 1, uw, m).expand(uh, m, uw, m)
        rc = torch.stack([rows, cols], dim=-1).permute(0, 2, 1, 3, 4).reshape(uh * uw, unit, 2)
        nh, nw = -(-uh // per_side), -(-uw // per_side)
        units = torch.arange(uh * uw).reshape(uh, uw)
        for frame in range(t):
            base = offset + frame * uh * uw
            for wy in range(nh):
                for wx in range(nw):
                    win = units[wy * per_side:(wy + 1) * per_side,
                                wx * per_side:(wx + 1) * per_side].reshape(-1)
                    window_index.append(win + base)
                    positions.append(rc[win].reshape(-1, 2))
                    window_seqlens.append(win.numel() * unit)
            frame_seqlens.append(h * w)
        offset += t * uh * uw
    index = torch.cat(window_index)
    return VisionGridLayout(
        grids=grids, num_patches=offset * unit, window_index=index,
        reverse_index=torch.argsort(index), positions=torch.cat(positions),
        window_seqlens=window_seqlens, frame_seqlens=frame_seqlens)


def block_diagonal_mask(seqlens: Sequence[int]) -> torch.Tensor:
    """[1, 1, N, N] bool, True where attention is masked (Megatron-Core's convention):
    each segment attends only within itself."""
    ids = torch.repeat_interleave(torch.arange(len(seqlens)), torch.tensor(list(seqlens)))
    return (ids[:, None] != ids[None, :])[None, None]
