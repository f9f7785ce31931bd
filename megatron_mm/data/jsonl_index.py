"""A JSONL file read lazily: one scan finds where each record's line starts, and a record
is parsed and validated only when it is read.

Memory is the index (12 bytes a record: offset and length; 8 more for line numbers
when the file has blank lines), not the records:
a file of millions of records opens in seconds on every rank. Checks that need the
record (JSON syntax, fields, placeholder counts, media files existing) happen when the
record is read, so a bad record is named then (see ``MultimodalDataset``'s
``bad_record_policy``). Ids are not checked for uniqueness across the file (that needs
every record); evaluation output names records by id and line.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
from collections.abc import Sequence

import numpy as np

from .records import DataRecordError, parse_record

_SCAN_CHUNK = 1 << 24  # bytes compared at a time: bounds the scan's temporary memory
_WHITESPACE = b" \t\r\n\f\v"


def _release_freed_memory() -> None:
    """Hand the scan's freed temporaries back to the OS: glibc keeps freed heap memory
    (arrays under its mmap threshold) in the process otherwise, tens of MB per million
    lines. A no-op where the C library has no malloc_trim."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def scan_lines(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(start offset, length, 1-based line number) of every non-blank line of ``path``;
    line numbers are None when no line is blank (record i is on line i + 1)."""
    size = os.path.getsize(path)
    if size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int32), None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = np.frombuffer(mm, dtype=np.uint8)
        newlines = [np.flatnonzero(buf[lo:lo + _SCAN_CHUNK] == 10) + lo
                    for lo in range(0, size, _SCAN_CHUNK)]
        if buf[-1] != 10:  # a last line without a newline ends at the end of the file
            newlines.append(np.array([size], np.int64))
        ends = np.concatenate(newlines)
        del newlines
        starts = np.empty_like(ends)
        starts[0] = 0
        np.add(ends[:-1], 1, out=starts[1:])
        lengths = np.subtract(ends, starts, out=ends).astype(np.int32)
        del ends
        # A JSON object line starts with "{"; only lines that start otherwise (rare) are
        # looked at to drop the blank ones.
        first = np.zeros(len(starts), np.uint8)  # an empty line counts as "odd": blank
        nonempty = lengths > 0
        first[nonempty] = buf[starts[nonempty]]
        odd = np.flatnonzero(first != ord("{"))
        blank = [i for i in odd
                 if not bytes(buf[starts[i]:starts[i] + lengths[i]]).strip(_WHITESPACE)]
        del buf, first, nonempty, odd  # release the mapping's buffer before the mmap closes
    if blank:
        keep = np.ones(len(starts), bool)
        keep[blank] = False
        lines = np.flatnonzero(keep) + 1
        starts, lengths = starts[keep], lengths[keep]
    else:
        lines = None
    _release_freed_memory()
    return starts, lengths, lines


class JsonlRecords(Sequence):
    """The records of a JSONL file, parsed on access (``records[i]`` is a ``Record``).

    Reads use ``os.pread`` on a descriptor opened per process, so DataLoader workers
    forked from this object each read independently.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.path.abspath(os.fspath(path))
        self.name = os.path.basename(self.path)
        self.base_dir = os.path.dirname(self.path)
        self.offsets, self.lengths, self.line_numbers = scan_lines(self.path)
        self._fd, self._pid = None, None

    def __len__(self) -> int:
        return len(self.offsets)

    def __getstate__(self):  # a pickled copy (spawned workers) opens its own descriptor
        return {**self.__dict__, "_fd": None, "_pid": None}

    def _read(self, i: int) -> bytes:
        if self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        return os.pread(self._fd, int(self.lengths[i]), int(self.offsets[i]))

    def line(self, i: int) -> int:
        return i + 1 if self.line_numbers is None else int(self.line_numbers[i])

    def source(self, i: int) -> str:
        return f"{self.name} line {self.line(i)}"

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"record {i} out of range for {self.name} ({len(self)} records)")
        source = self.source(i)
        try:
            obj = json.loads(self._read(i))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataRecordError(f"{source}: invalid JSON: {e}") from None
        return parse_record(obj, source=source, base_dir=self.base_dir,
                            default_id=f"{self.name}:{self.line(i)}")

    def __del__(self):
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
