"""Built-in dataset: sklearn's 1,797 real 8x8 handwritten digits as image QA records.

    python -m megatron_mm.data.digits --out DIR [--image-files]

Writes DIR/train.jsonl (1,500) and DIR/valid.jsonl (297), split by a seed-0
permutation. Images are inline base64 PNG data URIs by default (2 files), or PNG
files under DIR/images/ with --image-files. Re-running is a no-op when the
files already match (checked via DIR/digits_manifest.json).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os

import numpy as np
from PIL import Image

DIGITS_VERSION = 1  # bump when the output format changes, to force regeneration
NUM_TRAIN = 1500
SPLIT_SEED = 0
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
QUESTIONS = (
    "<image>\nWhat digit is this?",
    "<image>\nWhich digit is written in this image?",
    "<image>\nWhat number is shown here?",
)
# The Qwen demos' (families/qwen2_5_vl/digits.py): several items a question, in order
IMAGE_QUESTION = "Which digits are shown, in order?"
VIDEO_QUESTION = "Which digits appear, in order?"
MANIFEST = "digits_manifest.json"


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [1797, 8, 8] scaled by 255/16 and rounded, targets int [1797])."""
    from sklearn.datasets import load_digits  # lazy: sklearn is only needed here

    d = load_digits()
    images = np.rint(d.images * 255.0 / 16.0).astype(np.uint8)
    return images, d.target.astype(np.int64)


def split_indices() -> tuple[np.ndarray, np.ndarray]:
    """Fixed split of sklearn indices: (train 1500, valid 297)."""
    perm = np.random.default_rng(SPLIT_SEED).permutation(1797)
    return perm[:NUM_TRAIN], perm[NUM_TRAIN:]


def png_bytes(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")  # uint8 2-D array -> mode "L"
    return buf.getvalue()


def build_files(image_files: bool = False) -> dict[str, bytes]:
    """All output files (relative path -> content), built in memory."""
    images, targets = load_digits_arrays()
    files: dict[str, bytes] = {}
    for split, idx in zip(("train", "valid"), split_indices()):
        lines = []
        for i, src in enumerate(idx):
            rid = f"digits-{split}-{i:05d}"
            png = png_bytes(images[src])
            if image_files:
                rel = f"images/{rid}.png"
                files[rel] = png
                image = rel
            else:
                image = {"data": "data:image/png;base64," + base64.b64encode(png).decode("ascii")}
            rec = {
                "id": rid,
                "conversations": [
                    {"from": "human", "value": QUESTIONS[i % len(QUESTIONS)]},
                    {"from": "gpt", "value": WORDS[targets[src]]},
                ],
                "images": [image],
                "label": int(targets[src]),  # extra fields are ignored by the reader
                "sklearn_index": int(src),
            }
            lines.append(json.dumps(rec, separators=(",", ":")))
        files[f"{split}.jsonl"] = ("\n".join(lines) + "\n").encode("utf-8")
    return files


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _up_to_date(out_dir: str, image_files: bool) -> bool:
    return manifest_matches(out_dir, {"version": DIGITS_VERSION, "image_files": image_files})


def manifest_matches(out_dir: str, fields: dict) -> bool:
    """Whether ``out_dir``'s manifest has these fields and every file it lists is intact."""
    try:
        with open(os.path.join(out_dir, MANIFEST)) as f:
            manifest = json.load(f)
        if any(manifest.get(k) != v for k, v in fields.items()):
            return False
        for rel, digest in manifest["sha256"].items():
            with open(os.path.join(out_dir, rel), "rb") as f:
                if _sha256(f.read()) != digest:
                    return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _write_atomic(path: str, data: bytes) -> None:
    # Write-then-rename so a concurrent reader never sees a half-written file.
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def prepare_digits(out_dir: str | os.PathLike, image_files: bool = False,
                   force: bool = False) -> tuple[str, str]:
    """Write the digits dataset into `out_dir` (idempotent); returns (train_path, valid_path)."""
    out_dir = os.fspath(out_dir)
    train, valid = os.path.join(out_dir, "train.jsonl"), os.path.join(out_dir, "valid.jsonl")
    if not force and _up_to_date(out_dir, image_files):
        return train, valid
    files = build_files(image_files)
    for rel, data in files.items():
        _write_atomic(os.path.join(out_dir, rel), data)
    manifest = {"version": DIGITS_VERSION, "image_files": image_files,
                "sha256": {rel: _sha256(data) for rel, data in files.items()}}
    _write_atomic(os.path.join(out_dir, MANIFEST), json.dumps(manifest, indent=1).encode())
    return train, valid


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--image-files", action="store_true",
                   help="write PNG files under images/ instead of inline base64")
    p.add_argument("--force", action="store_true", help="rewrite even if up to date")
    args = p.parse_args(argv)
    train, valid = prepare_digits(args.out, image_files=args.image_files, force=args.force)
    print(f"train: {train}\nvalid: {valid}")


if __name__ == "__main__":
    main()
