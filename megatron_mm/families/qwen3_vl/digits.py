"""Built-in data of the Qwen3-VL demo: the Qwen2.5-VL demo's digits
(``families/qwen2_5_vl/digits.py``: 1-3 images of varying sizes, clips of 2 or 4 frames at
2 fps) drawn in 32 px cells, one merged token of Qwen3-VL's 16 px patches, so the resize
rule keeps every image and frame as drawn. The clips' timestamps (``<t seconds>`` before
each temporal patch) are the media processor's text, not the records'.

    python -m megatron_mm.families.qwen3_vl.digits --out DIR
"""
from __future__ import annotations

import argparse
import os

from ..qwen2_5_vl.digits import prepare_digits_qwen

UNIT = 32  # patch 16 x merge 2


def prepare_digits_qwen3(out_dir: str | os.PathLike, force: bool = False) -> tuple[str, str]:
    """Write the data into ``out_dir`` (idempotent); returns (train_path, valid_path)."""
    return prepare_digits_qwen(out_dir, force, unit=UNIT, kind="digits_qwen3")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--force", action="store_true", help="rewrite even if up to date")
    args = p.parse_args(argv)
    train, valid = prepare_digits_qwen3(args.out, force=args.force)
    print(f"train: {train}\nvalid: {valid}")


if __name__ == "__main__":
    main()
