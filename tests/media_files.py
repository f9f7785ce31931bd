"""Small media and record files the data tests write: random images, JSONL records."""

import json

import numpy as np
from PIL import Image


def random_image(h, w, seed, mode="RGB"):
    """A PIL image of random pixels (``mode``: RGB, RGBA or L)."""
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    x = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
    return Image.fromarray(x[..., 0] if channels == 1 else x, mode=mode)


def write_image(path, w, h, seed):
    """A random RGB PNG of ``w`` x ``h`` at ``path``; returns the path as a string."""
    random_image(h, w, seed).save(path)
    return str(path)


def write_records(tmp_path, lines):
    """``lines`` as ``tmp_path / data.jsonl``, read back as records."""
    from megatron_mm.data.records import read_records

    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return read_records(path)
