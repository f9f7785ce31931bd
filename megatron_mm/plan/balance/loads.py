"""Per-sample work: vision tiles and LLM tokens, and the reader for length statistics.

A sample's vision work is how many images / tiles the encoder processes; its LLM work is
its full sequence length, media tokens included. The statistics format is OmniBal's: one
JSON list per file (optionally gzip), one ``{"vit_num": v, "token_num": t, ...}`` per sample.
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Iterable, List, NamedTuple

from ..errors import PlanError


class SampleLoad(NamedTuple):
    vision: int  # images / tiles through the vision encoder
    tokens: int  # LLM sequence length, media tokens included


def open_stats(path: str):
    """A statistics file, gzip-compressed or plain, as text."""
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def read_length_stats(path: str | os.PathLike) -> List[SampleLoad]:
    """One statistics file; a bad record is reported with its file and index."""
    path = os.fspath(path)
    with open_stats(path) as f:
        records = json.load(f)
    if not isinstance(records, list):
        raise PlanError(f"{path}: expected a JSON list of per-sample records")
    loads = []
    for i, rec in enumerate(records):
        try:
            v, t = rec["vit_num"], rec["token_num"]
        except (KeyError, TypeError):
            raise PlanError(f"{path}: record {i} lacks vit_num / token_num: {rec!r}") from None
        if not (isinstance(v, int) and isinstance(t, int) and v >= 0 and t >= 1):
            raise PlanError(f"{path}: record {i} has vit_num={v!r}, token_num={t!r} "
                            "(need integers, vit_num >= 0, token_num >= 1)")
        loads.append(SampleLoad(v, t))
    return loads


def stats_files(directory: str | os.PathLike) -> List[str]:
    """The statistics files of a directory (``*.json`` / ``*.json.gz``), sorted by name."""
    directory = os.fspath(directory)
    names = sorted(n for n in os.listdir(directory) if n.endswith((".json", ".json.gz")))
    if not names:
        raise PlanError(f"{directory}: no *.json or *.json.gz length statistics")
    return [os.path.join(directory, n) for n in names]


def read_all(paths: Iterable[str | os.PathLike]) -> List[SampleLoad]:
    """Several files (or directories of files) as one dataset, in the order given."""
    loads: List[SampleLoad] = []
    for p in paths:
        for f in stats_files(p) if os.path.isdir(p) else [os.fspath(p)]:
            loads += read_length_stats(f)
    return loads
