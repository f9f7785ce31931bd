"""JSONL data checked before the first iteration: the ranks read every record together
(each a share), agree on the first bad one, and all stop with the same one-line error,
which rank 0 alone prints (``user_errors``), before any rank waits in a collective that
another has left. What the check cannot see cheaply (an image that does not decode, a
record over --seq-length) is still found when the record is read."""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ...data.check import bad_records, count_records
from ...data.records import DataRecordError
from ..rank_print import print_rank_0


class BadDataError(DataRecordError):
    """A bad record found before training: every rank raises it, rank 0 reports it."""

    rank_local = False


def check_before_training(paths: Sequence[str]) -> None:
    """Raise BadDataError naming the first bad record of ``paths`` (JSONL files) on every
    rank; the number of others and the tool that lists them follow it."""
    start = time.perf_counter()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    first, count = None, 0
    for bad in bad_records(paths, rank, world):  # this rank's first, and how many
        first, count = first or bad, count + 1
    everyone = [None] * world
    torch.distributed.all_gather_object(everyone, (first, count))
    firsts = [f for f, _ in everyone if f is not None]
    if firsts:
        first = min(firsts, key=lambda b: (b.file, b.index))
        count = sum(c for _, c in everyone)
        more = (f" ({count - 1} more bad records: python tools/check_data.py "
                f"{' '.join(paths)} lists them all)" if count > 1 else "")
        raise BadDataError(f"{paths[first.file]}: {first.reason}{more}")
    print_rank_0(f" > checked the {count_records(paths)} records of {', '.join(paths)} "
                 f"before training ({time.perf_counter() - start:.1f} s): none is malformed "
                 f"or names a missing file")
