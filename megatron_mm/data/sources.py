"""What ``--data-path`` / ``--valid-data-path`` name: JSONL files or Megatron-Energon
datasets, one or a weighted blend. Pure Python (checked with the other flags, before any
process group exists)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from ..config import ConfigError


class DataConfigError(ConfigError):
    """A data flag names something unusable; the message names the flag."""


def parse_blend(values: Sequence[str], flag: str = "--data-path"
                ) -> tuple[list[str], list[float] | None]:
    """``["A"]`` -> (["A"], None); ``["0.7", "A", "0.3", "B"]`` -> (paths, normalised
    weights). Raises DataConfigError naming ``flag`` on a malformed list."""
    values = list(values)
    if len(values) == 1:
        return values, None
    if len(values) % 2:
        raise DataConfigError(f"{flag}: a blend is weight-path pairs (0.7 A 0.3 B); got "
                              f"{len(values)} values")
    weights, paths = [], []
    for w, p in zip(values[0::2], values[1::2]):
        try:
            weights.append(float(w))
        except ValueError:
            raise DataConfigError(f"{flag}: {w!r} is not a weight; a blend is weight-path "
                                  "pairs (0.7 A 0.3 B)") from None
        paths.append(p)
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise DataConfigError(f"{flag}: weights must be non-negative with a positive sum, "
                              f"got {weights}")
    total = sum(weights)
    return paths, [w / total for w in weights]


@dataclass(frozen=True)
class DataSources:
    """What ``--data-path`` / ``--valid-data-path`` name, resolved to files."""

    kind: str  # "jsonl" or "energon"
    train: list[str]  # JSONL files, or Energon dataset dirs / metadataset files
    weights: Optional[list[float]]  # normalised; None for one dataset
    valid: list[str]  # JSONL files or Energon dataset dirs (their "val" split)
    valid_kind: str


def is_energon(path: str) -> bool:
    """A prepared Energon dataset directory (``.nv-meta/``) or a metadataset ``.yaml``."""
    return (os.path.isdir(os.path.join(path, ".nv-meta"))
            or (os.path.isfile(path) and path.endswith((".yaml", ".yml"))))


def resolve_sources(data_path: list[str], valid_data_path: Optional[str]) -> DataSources:
    """Check the data flags up front (paths exist, one kind, validation data found)."""
    paths, weights = parse_blend(data_path)
    kinds, train, valid = set(), [], []
    for path in paths:
        if is_energon(path):
            kinds.add("energon")
            train.append(path)
            if os.path.isdir(path):
                valid.append(path)
        elif os.path.isdir(path):
            kinds.add("jsonl")
            train.append(os.path.join(path, "train.jsonl"))
            if not os.path.isfile(train[-1]):
                raise DataConfigError(f"--data-path: {path} is a directory without train.jsonl "
                                      "(nor an Energon dataset: no .nv-meta/)")
            valid.append(os.path.join(path, "valid.jsonl"))
        elif os.path.isfile(path):
            kinds.add("jsonl")
            train.append(path)
        else:
            raise DataConfigError(f"--data-path: {path} does not exist")
    if len(kinds) > 1:
        raise DataConfigError("--data-path mixes JSONL and Energon datasets; convert the JSONL "
                              "ones with tools/jsonl_to_energon.py")
    kind = kinds.pop()
    if valid_data_path is not None:
        if not os.path.exists(valid_data_path):
            raise DataConfigError(f"--valid-data-path: {valid_data_path} does not exist")
        valid_kind = "energon" if is_energon(valid_data_path) else "jsonl"
        if valid_kind == "jsonl" and os.path.isdir(valid_data_path):
            valid_data_path = os.path.join(valid_data_path, "valid.jsonl")
            if not os.path.isfile(valid_data_path):
                raise DataConfigError(f"--valid-data-path: {valid_data_path} does not exist")
        valid = [valid_data_path]
    else:
        valid_kind = kind
        if not valid or len(valid) < len(train):
            raise DataConfigError(
                "--data-path names a .jsonl file or an Energon metadataset: pass "
                "--valid-data-path too, or point --data-path at a directory with "
                "train.jsonl/valid.jsonl (or a prepared Energon dataset)")
        for path in valid:
            if kind == "jsonl" and not os.path.isfile(path):
                raise DataConfigError(f"--valid-data-path: not given and {path} does not exist")
    return DataSources(kind, train, weights, valid, valid_kind)


