"""A tiny Qwen2.5-VL dataset for training tests: images of several sizes (each its own token
count) and short videos of frame files, one or two items per record, with a question."""

from __future__ import annotations

import json
import os

import numpy as np

# Tiny tower: 28 x 28 pixel merge units, windows of 2 x 2 units, 2 layers (the second
# attends over whole frames); images of 28..84 px per side give 1..9 tokens.
QWEN_VL_MODEL = [
    "--vision-model-type", "qwen2_5_vl", "--vision-hidden-size", "32",
    "--vision-num-layers", "2", "--vision-num-attention-heads", "2",
    "--vision-ffn-hidden-size", "64", "--patch-dim", "14", "--vision-window-size", "56",
    "--vision-fullatt-block-indexes", "1", "--min-pixels", "784", "--max-pixels", "7056",
    "--video-min-pixels", "784", "--video-max-pixels", "3136",
    "--position-embedding-type", "mrope", "--mrope-section", "2", "2", "4",
]


def _png(path: str, w: int, h: int, rng) -> str:
    from PIL import Image

    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return os.path.basename(path)


def write_qwen_vl_data(out: str, n_train: int = 24, n_valid: int = 8, unit: int = 28) -> str:
    """``unit``: the merge unit's side in pixels (Qwen2.5-VL's 28; Qwen3-VL's 32): images
    of 1 to 3 units per side, frames of 2 x 1 units."""
    rng = np.random.default_rng(0)
    sizes = [(unit * a, unit * b) for a, b in ((1, 1), (2, 1), (2, 2), (3, 2), (1, 3), (3, 3))]
    for split, n in (("train", n_train), ("valid", n_valid)):
        lines = []
        for i in range(n):
            record = {"id": f"{split}-{i}"}
            w, h = sizes[i % len(sizes)]
            images = [_png(os.path.join(out, f"{split}-{i}-a.png"), w, h, rng)]
            text = "<image>"
            if i % 3 == 1:  # a second image of another size
                images.append(_png(os.path.join(out, f"{split}-{i}-b.png"), h, w, rng))
                text += " <image>"
            if i % 3 == 2:  # a video of 2 or 4 frames
                frames = [_png(os.path.join(out, f"{split}-{i}-f{j}.png"), 2 * unit,
                               unit, rng)
                          for j in range(2 + 2 * (i % 2))]
                record["videos"] = [{"frames": frames, "fps": 2}]
                text += " <video>"
            record["images"] = images
            record["conversations"] = [
                {"from": "human", "value": text + "\nHow many items?"},
                {"from": "gpt", "value": str(len(images) + len(record.get("videos", [])))}]
            lines.append(json.dumps(record))
        with open(os.path.join(out, f"{split}.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return out
