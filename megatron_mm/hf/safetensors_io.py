"""Hugging Face weight files: one ``model.safetensors`` or shards listed in an index."""

from __future__ import annotations

import json
import os
from typing import Dict

import torch

from .errors import ConversionError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def read_weights(directory: str) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = os.path.join(directory, INDEX)
    if os.path.isfile(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    elif os.path.isfile(os.path.join(directory, SINGLE)):
        files = [SINGLE]
    else:
        raise ConversionError(f"{directory}: no {SINGLE} or {INDEX} (only safetensors "
                              f"weights are read)")
    out = {}
    for name in files:
        out.update(load_file(os.path.join(directory, name)))
    return out


def write_weights(tensors: Dict[str, torch.Tensor], directory: str, filename: str = SINGLE):
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(directory, filename), metadata={"format": "pt"})
