"""Human-readable summaries of chunks (for the CLI; plans themselves stay data)."""

from __future__ import annotations

from typing import List, Sequence

from .layers import Layer

_SHORT = {"vision_embed": "embed", "audio_embed": "embed", "llm_embed": "embedding",
          "projector": "projector", "llm_head": "output"}


def describe_chunk(chain: Sequence[Layer], start: int, end: int) -> str:
    """E.g. ``vision[embed, 0-23, projector] llm[embedding, 0-4]``."""
    parts: List[str] = []
    branch, items, run = None, [], []

    def flush_run():
        if run:
            items.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run.clear()

    def flush_branch():
        flush_run()
        if branch is not None:
            parts.append(f"{branch}[{', '.join(items)}]")
        items.clear()

    for layer in chain[start:end]:
        if layer.branch != branch:
            flush_branch()
            branch = layer.branch
        if layer.kind in _SHORT:
            flush_run()
            items.append(_SHORT[layer.kind])
        else:
            run.append(int(layer.module.rsplit(".", 1)[1]))
    flush_branch()
    return " ".join(parts)


def describe_contents(chain: Sequence[Layer], start: int, end: int) -> str:
    """One branch's chunk in words, e.g. ``embedding + 2 layers`` or ``2 layers +
    output``: the transformer layers counted, the other entries named."""
    items: List[str] = []
    layers = 0

    def flush():
        nonlocal layers
        if layers:
            items.append(f"{layers} layer{'s' if layers > 1 else ''}")
            layers = 0

    for layer in chain[start:end]:
        if layer.kind in _SHORT:
            flush()
            items.append(_SHORT[layer.kind])
        else:
            layers += 1
    flush()
    return " + ".join(items) or "nothing"
