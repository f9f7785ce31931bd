"""JSONL record format (see docs/data.md) and its validation (on read; see jsonl_index.py).

Everything that is cheap to check (JSON syntax, fields, roles, placeholder
counts, image files existing) is checked when a record is parsed: by the loaders
when they read it (``JsonlRecords``), by ``read_records`` for a whole file up
front. Image decoding is left to the encoding step.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field


class DataRecordError(ValueError):
    """A record is malformed; the message names the file, line and record id."""

    # Records are checked when read, each by the one rank that reads it: that rank reports
    # the error (the user-error reporter prints rank-local errors on any rank).
    rank_local = True


@dataclass(frozen=True)
class ModalitySpec:
    """How one modality appears in a record: its text placeholder and list key."""

    name: str
    placeholder: str
    record_key: str


# Adding a modality only needs an entry here plus a media loader in processing.py;
# the tokenizer appends one special token per entry, in this order, after the base
# vocabulary (<image>, <audio>, then <video>).
MODALITIES: dict[str, ModalitySpec] = {
    "image": ModalitySpec(name="image", placeholder="<image>", record_key="images"),
    "audio": ModalitySpec(name="audio", placeholder="<audio>", record_key="audios"),
    # Each item: {"frames": [frame paths or data], "fps": frames per second}.
    "video": ModalitySpec(name="video", placeholder="<video>", record_key="videos"),
}

# What the loaders do with a record found bad when read (--bad-record-policy).
BAD_RECORD_POLICIES = ("fail", "skip")

HUMAN_ROLES = ("human", "user")
ASSISTANT_ROLES = ("gpt", "assistant")


def placeholder_pattern() -> re.Pattern[str]:
    """Regex matching any modality placeholder (used to split text into segments)."""
    return re.compile("|".join(re.escape(m.placeholder) for m in MODALITIES.values()))


@dataclass(frozen=True)
class MediaRef:
    """One media item: a resolved file path, inline base64 data (kept undecoded), or the
    file's bytes as a WebDataset shard holds them (``raw``, named by ``member``)."""

    path: str | None = None
    data: str | None = None  # "data:image/png;base64,..." or bare base64
    raw: bytes | None = None
    member: str | None = None  # the shard member ``raw`` came from, for messages
    # A video: its frames (each a MediaRef) and their rate; path / data / raw unset.
    frames: tuple["MediaRef", ...] | None = None
    fps: float | None = None

    def describe(self) -> str:
        if self.frames is not None:
            return f"video of {len(self.frames)} frames at {self.fps} fps"
        if self.path is not None:
            return self.path
        return self.member if self.raw is not None else "<inline data>"


@dataclass(frozen=True)
class Turn:
    role: str  # "human" or "assistant" (normalised)
    text: str


@dataclass
class Record:
    """A validated record. Exactly one of `turns` (conversation) / `text` is set."""

    id: str
    turns: list[Turn] | None = None
    text: str | None = None
    media: dict[str, list[MediaRef]] = field(default_factory=dict)
    source: str = "<memory>"  # "file.jsonl line 12", for error messages

    @property
    def is_conversation(self) -> bool:
        return self.turns is not None

    def where(self) -> str:
        return f"record {self.id!r} ({self.source})"


def _parse_video(item: object, base_dir: str, where: str, key: str, i: int,
                 check_files: bool) -> MediaRef:
    """{"frames": [path or data, ...], "fps": number} -> a video MediaRef."""
    if not isinstance(item, dict) or not isinstance(item.get("frames"), list) \
            or not item["frames"]:
        raise DataRecordError(f"{where}: {key}[{i}] must be an object with a non-empty "
                              "'frames' list (frame paths or data) and an 'fps'")
    fps = item.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
        raise DataRecordError(f"{where}: {key}[{i}] needs a positive 'fps' (frames per "
                              f"second), got {fps!r}")
    frames = tuple(_parse_media_item(f, base_dir, where, f"{key}[{i}].frames", j, check_files)
                   for j, f in enumerate(item["frames"]))
    return MediaRef(frames=frames, fps=float(fps))


def _parse_media_item(item: object, base_dir: str, where: str, key: str, i: int,
                      check_files: bool) -> MediaRef:
    if key == MODALITIES["video"].record_key:
        return _parse_video(item, base_dir, where, key, i, check_files)
    if isinstance(item, dict):
        data = item.get("data")
        if not isinstance(data, str) or not data:
            raise DataRecordError(
                f"{where}: {key}[{i}] is an object without a non-empty 'data' string")
        return MediaRef(data=data)
    if not isinstance(item, str) or not item:
        raise DataRecordError(
            f"{where}: {key}[{i}] must be a path string or an object {{'data': ...}}")
    if item.startswith("data:"):  # a data URI given directly as the string
        return MediaRef(data=item)
    path = item if os.path.isabs(item) else os.path.join(base_dir, item)
    if check_files and not os.path.exists(path):
        raise DataRecordError(f"{where}: {key}[{i}] file not found: {path}")
    return MediaRef(path=path)


def parse_record(obj: object, *, source: str = "<memory>", base_dir: str = ".",
                 default_id: str | None = None, check_files: bool = True) -> Record:
    """Validate one decoded JSON object and return a Record.

    `source` is used in messages ("file.jsonl line 12"); relative media paths
    resolve against `base_dir` (the JSONL file's directory).
    """
    if not isinstance(obj, dict):
        raise DataRecordError(f"{source}: a record must be a JSON object, got {type(obj).__name__}")
    rid = obj.get("id", default_id)
    if rid is None or isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise DataRecordError(f"{source}: missing or invalid 'id' (a non-empty string or integer)")
    rid = str(rid)
    where = f"record {rid!r} ({source})"

    has_conv, has_text = "conversations" in obj, "text" in obj
    if has_conv == has_text:
        raise DataRecordError(f"{where}: needs exactly one of 'conversations' or 'text'")

    rec = Record(id=rid, source=source)
    if has_text:
        if not isinstance(obj["text"], str):
            raise DataRecordError(f"{where}: 'text' must be a string")
        rec.text = obj["text"]
        texts = [rec.text]
    else:
        rec.turns = _parse_turns(obj["conversations"], where)
        texts = [t.text for t in rec.turns]
        for t in rec.turns:  # media in answers would have to be generated; unsupported
            if t.role == "assistant" and placeholder_pattern().search(t.text):
                raise DataRecordError(
                    f"{where}: media placeholders are only allowed in human turns")

    for name, spec in MODALITIES.items():
        items = obj.get(spec.record_key, [])
        if not isinstance(items, list):
            raise DataRecordError(f"{where}: '{spec.record_key}' must be a list")
        n_ph = sum(t.count(spec.placeholder) for t in texts)
        if n_ph != len(items):
            raise DataRecordError(
                f"{where} has {n_ph} {spec.placeholder} placeholders but {len(items)} "
                f"{spec.record_key}")
        rec.media[name] = [_parse_media_item(it, base_dir, where, spec.record_key, i, check_files)
                           for i, it in enumerate(items)]
    return rec


def _parse_turns(conv: object, where: str) -> list[Turn]:
    if not isinstance(conv, list) or not conv:
        raise DataRecordError(f"{where}: 'conversations' must be a non-empty list")
    turns = []
    for i, t in enumerate(conv):
        if not (isinstance(t, dict) and isinstance(t.get("from"), str)
                and isinstance(t.get("value"), str)):
            raise DataRecordError(
                f"{where}: conversations[{i}] needs string fields 'from' and 'value'")
        role = t["from"].lower()
        if role in HUMAN_ROLES:
            role = "human"
        elif role in ASSISTANT_ROLES:
            role = "assistant"
        else:
            raise DataRecordError(f"{where}: conversations[{i}] has unknown role {t['from']!r} "
                                  f"(expected one of {HUMAN_ROLES + ASSISTANT_ROLES})")
        expected = "human" if i % 2 == 0 else "assistant"
        if role != expected:
            article = "a" if i % 2 == 0 else "an"
            raise DataRecordError(
                f"{where}: conversations[{i}] should be {article} {expected} turn "
                "(turns must alternate human/assistant, starting with human)")
        turns.append(Turn(role=role, text=t["value"]))
    if turns[-1].role != "assistant":
        raise DataRecordError(f"{where}: the last turn must be an assistant turn")
    return turns


def read_records(path: str | os.PathLike, check_files: bool = True) -> list[Record]:
    """Read and validate every record of a JSONL file (blank lines are skipped)."""
    path = os.fspath(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    records: list[Record] = []
    seen: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            source = f"{name} line {line_no}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataRecordError(f"{source}: invalid JSON: {e}") from None
            rec = parse_record(obj, source=source, base_dir=base_dir, check_files=check_files,
                               default_id=f"{name}:{line_no}")
            if rec.id in seen:  # ids identify samples in eval output; must be unique
                raise DataRecordError(f"{rec.where()}: duplicate id (first seen at {seen[rec.id]})")
            seen[rec.id] = source
            records.append(rec)
    return records
