"""A tiny InternVL dataset for training tests: digit images stretched to different aspect
ratios (1, 3, 4 or 5 tiles of 16 px with --max-num-tiles 4 and a thumbnail), some records
with two images, so micro-batches hold different tile counts."""

from __future__ import annotations

import json
import os


INTERNVL_MODEL = [
    "--vision-model-type", "internvit", "--vision-hidden-size", "32",
    "--vision-num-layers", "2", "--vision-num-attention-heads", "2",
    "--vision-ffn-hidden-size", "64", "--img-h", "16", "--img-w", "16", "--patch-dim", "4",
    "--vision-qk-norm", "--vision-add-qkv-bias", "--max-num-tiles", "4",
]
# (height, width) -> tiles at 16 px, max 4 tiles, thumbnail: 1, 3, 4, 5
SIZES = ((16, 16), (16, 32), (48, 16), (32, 32))


def write_internvl_digits(out: str, n_train: int = 32, n_valid: int = 8) -> str:
    from PIL import Image

    from megatron_mm.data.digits import load_digits_arrays

    images, targets = load_digits_arrays()
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        lines = []
        for i in range(n):
            k = i if split == "train" else n_train + i
            two = i % 3 == 2
            refs = []
            for j in range(2 if two else 1):
                h, w = SIZES[(i + j) % len(SIZES)]
                rel = f"images/{split}-{i}-{j}.png"
                img = Image.fromarray(images[k]).resize((w, h), Image.Resampling.NEAREST)
                img.save(os.path.join(out, rel))
                refs.append(rel)
            question = "<image>\n" * len(refs) + "What digit?"
            lines.append(json.dumps({
                "id": f"{split}-{i}",
                "conversations": [{"from": "human", "value": question},
                                  {"from": "gpt", "value": str(int(targets[k]))}],
                "images": refs}))
        with open(os.path.join(out, f"{split}.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return out
