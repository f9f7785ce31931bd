"""Which file of a checkpoint is damaged, found before any of it is read.

A save writes ``manifest.json`` into the iteration's directory: every file's size and
CRC-32 (zlib's, about 5 GB/s on one core; the ranks share the files). A load checks the
sizes first (a ``stat`` per file) and then the checksums. A checkpoint without a manifest
(saved by an older tree, or by Megatron-LM) is checked against its own structure:
Megatron-Core's ``metadata.json`` parses, torch's ``.metadata`` unpickles, and every
shard file holds the bytes ``.metadata`` places in it (a missing or truncated shard).

Problems are short texts naming the file (``"__1_0.distcp is missing"``); no process
group is used here: the caller shares the files out and agrees on the result.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Dict, List, Sequence, Tuple

MANIFEST = "manifest.json"
CONFIG = "metadata.json"  # Megatron-Core's backend and version of the checkpoint
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of the shards
# What every process reads first (older checkpoints keep the flags in common.pt)
INDEX = (CONFIG, DCP_METADATA, "common.pt")
_CHUNK = 1 << 22


def file_crc32(path: str) -> int:
    crc, buffer = 0, bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buffer)
            if not n:
                return crc
            crc = zlib.crc32(view[:n], crc)


def checkpoint_files(directory: str) -> List[str]:
    """The files under ``directory`` (relative paths, sorted), the manifest left out."""
    out = []
    for base, _, names in os.walk(directory):
        for name in names:
            relative = os.path.relpath(os.path.join(base, name), directory)
            if relative != MANIFEST:
                out.append(relative)
    return sorted(out)


def file_entries(directory: str, names: Sequence[str]) -> Dict[str, dict]:
    """Size and CRC-32 of each of ``names`` (relative to ``directory``)."""
    out = {}
    for name in names:
        path = os.path.join(directory, name)
        out[name] = {"size": os.path.getsize(path), "crc32": file_crc32(path)}
    return out


def write_manifest(directory: str, iteration: int, entries: Dict[str, dict]) -> None:
    path = os.path.join(directory, MANIFEST)
    with open(path, "w") as f:
        json.dump({"iteration": iteration, "checksum": "crc32",
                   "files": dict(sorted(entries.items()))}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _manifest(directory: str):
    """The manifest's files (name -> entry); None without one; a problem text if it does
    not parse."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return dict(json.load(f)["files"])
    except (ValueError, KeyError, TypeError, OSError) as e:
        return (f"{MANIFEST} is damaged ({type(e).__name__}: {e}; delete it to load "
                f"without the check)")


def damaged_files(directory: str, part: Tuple[int, int] = (0, 1), checksums: bool = True,
                  index_only: bool = False) -> List[str]:
    """What is wrong with the checkpoint in ``directory``: one text per damaged file.

    With a manifest: its files are missing, of another size, or (``checksums``) of another
    CRC-32; ``part`` = (i, n) checks every n-th file from the i-th (n ranks share them).
    Without one: its structure, checked by part 0 alone. ``index_only``: only the files
    every process reads first (``INDEX``), what each checks alone before any process
    group exists (a thousand ranks would each look at every shard otherwise)."""
    files = _manifest(directory)
    if files is None:
        return structure_problems(directory, shards=not index_only) if part[0] == 0 else []
    if isinstance(files, str):
        return [files] if part[0] == 0 else []
    problems = []
    names = [n for n in sorted(files) if n in INDEX or not index_only]
    for name in names[part[0]::part[1]]:
        try:
            problem = _file_problem(directory, name, files[name], checksums)
        except OSError as e:  # unreadable (EIO, a permission)
            problem = f"{name} could not be read ({e.strerror or e})"
        if problem:
            problems.append(problem)
    return problems


def _file_problem(directory: str, name: str, entry: dict, checksum: bool) -> str:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return f"{name} is missing"
    size = os.path.getsize(path)
    if size != entry["size"]:
        return (f"{name} has {size} bytes, {entry['size']} when saved"
                + (" (cut short)" if size < entry["size"] else ""))
    if checksum and file_crc32(path) != entry["crc32"]:
        return f"{name} does not match the CRC-32 it was saved with"
    return ""


def structure_problems(directory: str, shards: bool = True) -> List[str]:
    """A manifest-less checkpoint's structure: Megatron-Core's config, torch's index, and
    (``shards``) the shard files' sizes against the byte ranges the index places in them."""
    problems = []
    config = os.path.join(directory, CONFIG)
    if not os.path.isfile(config):
        problems.append(f"{CONFIG} is missing")
    else:
        try:
            with open(config) as f:
                json.load(f)
        except ValueError as e:
            problems.append(f"{CONFIG} does not parse ({e})")
    index = os.path.join(directory, DCP_METADATA)
    if not os.path.isfile(index):
        return problems + [f"{DCP_METADATA} is missing"]
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(directory).read_metadata()
        needed: Dict[str, int] = {}
        for info in (metadata.storage_data or {}).values():
            end = info.offset + info.length
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    except Exception as e:  # any failure to unpickle the index: the file is damaged
        return problems + [f"{DCP_METADATA} does not unpickle ({type(e).__name__}: {e})"]
    for name, end in sorted(needed.items() if shards else ()):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            problems.append(f"{name} is missing")
        elif os.path.getsize(path) < end:
            problems.append(f"{name} has {os.path.getsize(path)} bytes, {DCP_METADATA} "
                            f"places {end} there (cut short)")
    return problems
