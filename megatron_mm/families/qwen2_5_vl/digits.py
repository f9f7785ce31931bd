"""Built-in data of the Qwen2.5-VL demo: sklearn's real 8x8 handwritten digits rendered at
varying sizes and aspect ratios, several images per sample, and short digit "videos".

    python -m megatron_mm.families.qwen2_5_vl.digits --out DIR

Each record asks for the digits in order: "<image><image>\\nWhich digits are shown, in
order?" -> "three seven", or "<video>\\nWhich digits appear, in order?" over a clip of 2 or
4 frames (a multiple of the temporal patch, 2), one digit a frame. Images and frames are
drawn at sides that are multiples of 28 (one merged 2x2 patch of 14 px), so the Qwen-VL
resize rule keeps them as they are and a digit costs 1 to 9 LLM tokens.

Train records draw their digits from the 1,500 train digits of ``digits.py``'s split, the
valid records from the 297 others only (held-out handwriting). Inline PNG data URIs;
deterministic; re-running is a no-op when DIR's manifest matches.
"""
from __future__ import annotations

import argparse
import base64
import json
import os

import numpy as np
from PIL import Image

from ...data.digits import (IMAGE_QUESTION, MANIFEST, VIDEO_QUESTION, WORDS, _sha256,
                            _write_atomic, load_digits_arrays, manifest_matches, png_bytes,
                            split_indices)

DIGITS_QWEN_VERSION = 3  # bump when the output changes, to force regeneration
NUM_RECORDS = {"train": 4000, "valid": 320}
SEED = {"train": 1, "valid": 2}
UNIT = 28  # patch 14 x merge 2: sides in multiples of it are kept as drawn
IMAGE_CELLS = (1, 2, 3)  # each image its own width and height: 1 to 9 LLM tokens
FRAME_CELLS = (1, 2)  # all frames of a clip share one size
VIDEO_FPS = 2.0
# The record kinds, in turn: (modality, items, sides): 1-3 images, or a clip of 2 or 4
# frames.
KINDS = (("image", 1, IMAGE_CELLS), ("image", 2, IMAGE_CELLS), ("image", 3, IMAGE_CELLS),
         ("video", 2, FRAME_CELLS), ("video", 4, FRAME_CELLS))


def render(digit: np.ndarray, width: int, height: int, unit: int = UNIT) -> np.ndarray:
    """An 8x8 uint8 digit drawn at ``unit`` x ``unit`` (bilinear) in every cell of a
    ``width`` x ``height`` image (multiples of ``unit``), uint8 [h, w]: each merged token
    sees the whole digit, so the tokens of any size read alike. (A digit stretched over the
    whole image leaves a tiny model from scratch at chance for hundreds of steps: each
    token holds a different part of it at every size; docs/demo_qwen.md.)"""
    cell = np.asarray(Image.fromarray(digit).resize((unit, unit), Image.BILINEAR))
    return np.tile(cell, (height // unit, width // unit))


def _inline(img: np.ndarray) -> dict:
    return {"data": "data:image/png;base64," + base64.b64encode(png_bytes(img)).decode("ascii")}


def build_records(split: str, images: np.ndarray, targets: np.ndarray,
                  pool: np.ndarray, unit: int = UNIT) -> list[dict]:
    """``NUM_RECORDS[split]`` records whose digits come from the sklearn indices ``pool``,
    drawn in cells of ``unit`` px (one merged token of the family's patches)."""
    rng = np.random.default_rng(SEED[split])
    records = []
    for i in range(NUM_RECORDS[split]):
        modality, n, cells = KINDS[i % len(KINDS)]
        side_choices = [c * unit for c in cells]
        picks = [int(s) for s in rng.choice(pool, size=n, replace=False)]
        answer = " ".join(WORDS[targets[s]] for s in picks)
        rec = {"id": f"digits-qwen-{split}-{i:05d}"}
        if modality == "image":
            sides = rng.choice(side_choices, size=(n, 2))  # each image its own w, h
            rec["conversations"] = [
                {"from": "human", "value": "<image>" * n + "\n" + IMAGE_QUESTION},
                {"from": "gpt", "value": answer}]
            rec["images"] = [_inline(render(images[s], int(w), int(h), unit))
                             for s, (w, h) in zip(picks, sides)]
        else:
            w, h = (int(v) for v in rng.choice(side_choices, size=2))
            rec["conversations"] = [
                {"from": "human", "value": "<video>\n" + VIDEO_QUESTION},
                {"from": "gpt", "value": answer}]
            rec["videos"] = [{"frames": [_inline(render(images[s], w, h, unit)) for s in picks],
                              "fps": VIDEO_FPS}]
        rec["labels"] = [int(targets[s]) for s in picks]  # extra fields: ignored by the reader
        rec["sklearn_indices"] = picks
        records.append(rec)
    return records


def build_files(unit: int = UNIT) -> dict[str, bytes]:
    """Both split files (relative path -> content), built in memory."""
    images, targets = load_digits_arrays()
    files = {}
    for split, pool in zip(("train", "valid"), split_indices()):
        lines = [json.dumps(r, separators=(",", ":"))
                 for r in build_records(split, images, targets, pool, unit)]
        files[f"{split}.jsonl"] = ("\n".join(lines) + "\n").encode("utf-8")
    return files


def prepare_digits_qwen(out_dir: str | os.PathLike, force: bool = False, unit: int = UNIT,
                        kind: str = "digits_qwen") -> tuple[str, str]:
    """Write the data into ``out_dir`` (idempotent); returns (train_path, valid_path).
    ``unit``, ``kind``: another family's cell side and its manifest's name."""
    out_dir = os.fspath(out_dir)
    train, valid = os.path.join(out_dir, "train.jsonl"), os.path.join(out_dir, "valid.jsonl")
    fields = {"version": DIGITS_QWEN_VERSION, "kind": kind}
    if not force and manifest_matches(out_dir, fields):
        return train, valid
    files = build_files(unit)
    for rel, data in files.items():
        _write_atomic(os.path.join(out_dir, rel), data)
    manifest = {**fields, "sha256": {rel: _sha256(data) for rel, data in files.items()}}
    _write_atomic(os.path.join(out_dir, MANIFEST), json.dumps(manifest, indent=1).encode())
    return train, valid


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--force", action="store_true", help="rewrite even if up to date")
    args = p.parse_args(argv)
    train, valid = prepare_digits_qwen(args.out, force=args.force)
    print(f"train: {train}\nvalid: {valid}")


if __name__ == "__main__":
    main()
