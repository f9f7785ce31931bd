"""List every bad record of JSONL training data, each with its reason, before a run finds
the first one.

    python tools/check_data.py DATA_PATH [DATA_PATH ...]

DATA_PATH: what ``--data-path`` / ``--valid-data-path`` take for JSONL data, a ``.jsonl``
file or a directory holding ``train.jsonl`` (and ``valid.jsonl``, checked too); a blend's
weights may be left in (``0.7 A 0.3 B``). Each record is read as the training script reads
it (JSON syntax, fields, roles, placeholder counts, media files existing; images are not
decoded): one line per bad record naming file, line, record id and field, then a count.
Exit status 0: none bad; 1: some bad; 2: a DATA_PATH that is not JSONL data. Pure Python,
no torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron_mm.data.check import bad_records, count_records  # noqa: E402


def jsonl_files(paths: Sequence[str]) -> List[str]:
    """The JSONL files that ``paths`` name (ValueError naming one that names none)."""
    files = []
    for path in paths:
        try:
            float(path)  # a blend's weight
            if not os.path.exists(path):
                continue
        except ValueError:
            pass
        if os.path.isdir(path):
            found = [os.path.join(path, n) for n in ("train.jsonl", "valid.jsonl")
                     if os.path.isfile(os.path.join(path, n))]
            if not found:
                raise ValueError(f"{path} is a directory without train.jsonl or valid.jsonl")
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ValueError(f"{path} does not exist")
    return files


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("data_path", nargs="+", metavar="DATA_PATH")
    args = p.parse_args(argv)
    try:
        files = jsonl_files(args.data_path)
    except ValueError as e:
        print(f"{sys.argv[0]}: error: {e}", file=sys.stderr)
        return 2
    bad = 0
    for record in bad_records(files):
        print(f"{files[record.file]}: {record.reason}")
        bad += 1
    total = count_records(files)
    print(f"{bad} bad of {total} records in {', '.join(files)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
