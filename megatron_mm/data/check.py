"""Checking JSONL data before training: every record read as the loaders read it (JSON
syntax, fields, roles, placeholder counts, media files existing; no decoding), each bad
one named by file, line and field. ``tools/check_data.py`` lists them all; the training
script stops before its first iteration on the first one (``training/data_check.py``)."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .jsonl_index import JsonlRecords
from .records import DataRecordError


@dataclass(frozen=True)
class BadRecord:
    """Record ``index`` of file ``file`` (its place in the list checked) and why."""

    file: int
    index: int
    reason: str  # DataRecordError's message: file, line, record id, field


def bad_records(paths: Sequence[str], rank: int = 0, world: int = 1
                ) -> Iterator[BadRecord]:
    """The bad records of the JSONL files ``paths``, in order, among this ``rank``'s
    share of each file (every ``world``-th record): ranks check a file together."""
    for f, path in enumerate(paths):
        records = JsonlRecords(path)
        for i in range(rank, len(records), world):
            try:
                records[i]
            except DataRecordError as e:
                yield BadRecord(f, i, str(e))


def count_records(paths: Sequence[str]) -> int:
    return sum(len(JsonlRecords(p)) for p in paths)
