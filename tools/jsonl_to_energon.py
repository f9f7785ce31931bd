"""Convert the package's JSONL records to a Megatron-Energon WebDataset.

Writes ``<split>-NNNNNN.tar`` shards (one sample per record: the record's JSON plus each
image / audio file as a member), then what ``energon prepare`` writes: the shard index,
``.nv-meta/split.yaml`` (train.jsonl -> "train", valid.jsonl -> "val") and
``.nv-meta/dataset.yaml`` (a CrudeWebdataset, cooked by megatron_mm). Train on it with
``--data-path OUT``; blend several with ``--data-path 0.7 OUT_A 0.3 OUT_B``. Example::

    python tools/jsonl_to_energon.py --train data/digits/train.jsonl \\
        --valid data/digits/valid.jsonl --output data/digits-energon

Records are validated and their media files read here; a bad record stops the conversion
naming it, unless ``--bad-record-policy skip`` (then it is left out with a warning).
"""

from __future__ import annotations

import argparse
import os
import sys

from megatron_mm.data.records import BAD_RECORD_POLICIES, DataRecordError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", help="training records (.jsonl)")
    p.add_argument("--valid", help="validation records (.jsonl), Energon's 'val' split")
    p.add_argument("--input", help="a directory holding train.jsonl (and valid.jsonl); "
                                   "instead of --train/--valid")
    p.add_argument("--output", required=True, help="the dataset directory to write")
    p.add_argument("--shard-size", type=int, default=10000, help="samples per tar shard")
    p.add_argument("--bad-record-policy", choices=BAD_RECORD_POLICIES, default="fail")
    args = p.parse_args(argv)
    inputs = {}
    if args.input:
        if args.train or args.valid:
            p.error("pass --input or --train/--valid, not both")
        for split in ("train", "valid"):
            path = os.path.join(args.input, f"{split}.jsonl")
            if os.path.isfile(path):
                inputs[split] = path
    else:
        inputs = {k: v for k, v in (("train", args.train), ("valid", args.valid)) if v}
    if not inputs:
        p.error("nothing to convert: pass --train (and --valid) or --input DIR")
    for split, path in inputs.items():
        if not os.path.isfile(path):
            p.error(f"--{split}: {path} does not exist")
    if args.shard_size < 1:
        p.error("--shard-size must be positive")

    from megatron_mm.data.energon_convert import convert

    try:
        report = convert(inputs, args.output, args.shard_size, args.bad_record_policy)
    except DataRecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for split in inputs:
        print(f"{split}: {report.samples[split]} samples"
              + (f", {report.skipped[split]} bad records left out" if report.skipped[split]
                 else ""))
    print(f"wrote {len(report.shards)} shards and .nv-meta/ to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
