"""JSONL records -> an Energon WebDataset (tar shards, then what ``energon prepare`` writes:
``.nv-meta/split.yaml``, the shard index and ``dataset.yaml`` naming ``CrudeWebdataset``).

Each record becomes one shard sample (format: ``megatron_mm.data.energon``). Records are
validated and their media files read while converting; a bad record stops the conversion
naming it, or is left out with a warning under ``bad_record_policy="skip"``.
"""
from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from dataclasses import dataclass, field

from .jsonl_index import JsonlRecords
from .records import MODALITIES, DataRecordError, parse_record

SPLITS = {"train": "train", "valid": "val"}  # our file name -> Energon's split name
_MIME_EXT = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp",
             "image/bmp": "bmp", "audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav"}


@dataclass
class ConversionReport:
    samples: dict = field(default_factory=dict)  # split -> records written
    skipped: dict = field(default_factory=dict)  # split -> records left out
    shards: list = field(default_factory=list)


def _media_bytes(item, base_dir: str, where: str, key: str, i: int) -> tuple[bytes, str]:
    """(bytes, extension) of one media item of a JSONL record."""
    if isinstance(item, dict):
        item = item.get("data")
    if item.startswith("data:"):
        header, _, payload = item.partition(",")
        mime = header[len("data:"):].split(";")[0]
        return base64.b64decode(payload, validate=True), _MIME_EXT.get(mime, "bin")
    path = item if os.path.isabs(item) else os.path.join(base_dir, item)
    try:
        with open(path, "rb") as f:
            return f.read(), os.path.splitext(path)[1].lstrip(".").lower() or "bin"
    except OSError as e:
        raise DataRecordError(f"{where}: {key}[{i}] cannot be read: {e}") from None


def _bare_base64(item) -> bool:
    data = item.get("data") if isinstance(item, dict) else None
    return isinstance(data, str) and not data.startswith("data:")


def _sample_members(records: JsonlRecords, i: int) -> dict[str, bytes]:
    """The members (``json``, ``image0.png``, ...) of record ``i``'s shard sample."""
    source = records.source(i)
    try:
        obj = json.loads(records._read(i))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataRecordError(f"{source}: invalid JSON: {e}") from None
    default_id = f"{records.name}:{records.line(i)}"
    rec = parse_record(obj, source=source, base_dir=records.base_dir, default_id=default_id)
    obj.setdefault("id", rec.id)
    members = {}
    for spec in MODALITIES.values():
        names = []
        for j, item in enumerate(obj.get(spec.record_key, [])):
            if _bare_base64(item):
                data, ext = base64.b64decode(item["data"], validate=True), "bin"
            else:
                data, ext = _media_bytes(item, records.base_dir, rec.where(),
                                         spec.record_key, j)
            name = f"{spec.name}{j}.{ext}"
            members[name] = data
            names.append(name)
        if spec.record_key in obj:
            obj[spec.record_key] = names
    obj["__source__"] = source
    return {"json": json.dumps(obj, ensure_ascii=False).encode(), **members}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644  # reproducible shards
    tar.addfile(info, io.BytesIO(data))


def convert(inputs: dict[str, str], output: str, shard_size: int = 10000,
            bad_record_policy: str = "fail", log=print) -> ConversionReport:
    """Write ``inputs`` ({"train": path, "valid": path}) as an Energon dataset in
    ``output``: ``<split>-NNNNNN.tar`` shards of ``shard_size`` samples, in file order."""
    from megatron.energon.flavors.webdataset import BaseWebdatasetFactory

    if shard_size < 1:
        raise ValueError("shard_size must be positive")
    os.makedirs(output, exist_ok=True)
    report = ConversionReport()
    total = 0  # keys are unique across the dataset, all splits included (Energon needs it)
    for split, path in inputs.items():
        records = JsonlRecords(path)
        written, skipped, shard, tar = 0, 0, 0, None
        for i in range(len(records)):
            try:
                members = _sample_members(records, i)
            except (DataRecordError, ValueError) as e:
                if bad_record_policy == "fail":
                    raise DataRecordError(str(e)) from None
                log(f"WARNING: leaving out a bad record (--bad-record-policy skip): {e}")
                skipped += 1
                continue
            if tar is None or written % shard_size == 0 and written:
                if tar is not None:
                    tar.close()
                name = f"{split}-{shard:06d}.tar"
                tar = tarfile.open(os.path.join(output, name), "w")
                report.shards.append(name)
                shard += 1
            key = f"{total:09d}"  # no dots: WebDataset splits the key at the first dot
            for part, data in members.items():
                _add(tar, f"{key}.{part}", data)
            written += 1
            total += 1
        if tar is not None:
            tar.close()
        report.samples[split], report.skipped[split] = written, skipped
    patterns = [(SPLITS.get(split, split), f"{split}-[0-9]+[.]tar$") for split in inputs]
    BaseWebdatasetFactory.prepare_dataset(output, report.shards,
                                          split_parts_patterns=patterns,
                                          shuffle_seed=None, workers=1)
    with open(os.path.join(output, ".nv-meta", "dataset.yaml"), "w") as f:
        f.write("__module__: megatron.energon\n__class__: CrudeWebdataset\n")
    return report
