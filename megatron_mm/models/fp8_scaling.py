"""Transformer Engine's delayed-scaling rule: an amax history and scale updated in place
on the device (TE: ``_update_amax_history`` / ``_default_sf_compute``), shared by the casts
(``fp8_emulation``) and the global amax buffers (``fp8_state``)."""

from __future__ import annotations

import torch

FP32_MAX = torch.finfo(torch.float32).max


def amax_update(history: torch.Tensor, scale: torch.Tensor, fp8_max: float, algo: str,
                margin: int) -> None:
    """TE's delayed-scaling update of ``history`` [L, n] and ``scale`` [n] in place, per
    tensor (column): a newest amax (slot 0) of 0 leaves the column alone (no roll, scale
    kept); otherwise the window is the L newest amaxes (slots 1..L-1 and slot 0), the
    history rolls so the newest lands in slot L-1 and slot 0 is zeroed, and amax is the
    newest (``most_recent``) or the window's max (``max``, NaNs skipped). Device ops only:
    no host sync."""
    newest = history[0].clone()
    window = torch.cat([history[1:], newest.unsqueeze(0)])
    # TE's kernel takes the max with fmaxf, which skips NaNs.
    value = newest if algo == "most_recent" else torch.where(
        torch.isnan(window), torch.zeros_like(window), window).amax(dim=0)
    rolled = window.clone()
    rolled[0] = 0
    skip = newest == 0
    new_scale = (fp8_max / value) / (2 ** margin)
    new_scale = torch.where(skip | ~torch.isfinite(value) | (value <= 0), scale, new_scale)
    new_scale = torch.where(torch.isinf(new_scale), torch.full_like(new_scale, FP32_MAX),
                            new_scale)
    history.copy_(torch.where(skip.unsqueeze(0), history, rolled))
    scale.copy_(new_scale)
