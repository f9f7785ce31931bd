"""Record -> token sample (placeholder expansion, loss mask) and batch collation.

Conversation template (LLaVA v1 / Vicuna style), per (human, assistant) pair:
    [bos] once, then  tok("USER: " + human + " ASSISTANT:")  tok(" " + answer) [eos]
Loss is on the answer tokens and their eos. Text records: [bos] text [eos] with
loss on text tokens and eos. Media tokens, bos and prompts never carry loss.

Each placeholder becomes its item's placeholder tokens, wrapped in the tokenizer's item tags
for that modality when it has them (``tokenizer.item_tag``, ``--image-tag-type``):
``<img>`` + tokens + ``</img>``. The tags are input like the media tokens (no loss).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch

from .audio import AudioProcessorConfig
from .media import ImageProcessorConfig
from .media_processors import AudioProcessor, ImageProcessor
from .records import MODALITIES, DataRecordError, MediaRef, Record, placeholder_pattern
from .tokenizer import MultimodalTokenizer

USER_PREFIX = "USER: "
ASSISTANT_PREFIX = " ASSISTANT:"


@dataclass
class Sample:
    tokens: torch.Tensor  # int64 [S]
    labels: torch.Tensor  # int64 [S]; labels[t] = tokens[t + 1], last = pad
    loss_mask: torch.Tensor  # float32 [S]; 1 iff tokens[t + 1] is a loss token
    # "image": [N, 3, H, W]; "audio": [N, mel bins, frames], "audio_frames": [N] (true lengths)
    media: dict[str, torch.Tensor] = field(default_factory=dict)
    prompt_len: int = 0  # tokens up to and including the last "ASSISTANT:" (decode from here)
    answer: str = ""  # last assistant answer (stripped), the greedy-decoding target
    record_id: str = ""
    # int64 [3, S]: M-RoPE's (temporal, height, width) positions (Qwen2-VL family, from
    # families/qwen2_5_vl/mrope_positions.py); None: positions 0..S-1 on every axis.
    position_ids: Optional[torch.Tensor] = None


@dataclass
class TokenizedRecord:
    """Text-only encoding (no media decoded): enough to check lengths cheaply."""

    ids: list[int]
    is_loss: list[bool]  # per token: is this token a prediction target?
    prompt_len: int
    answer: str
    items_end: int = 0  # tokens up to and including the last media item (and its end tag)


@dataclass(frozen=True)
class ItemRuns:
    """An item's placeholder tokens as runs, each after its own text: Qwen3-VL's video,
    ``<t seconds>`` before each temporal patch's tokens. With item tags each run sits
    between its own pair, and the item has no outer pair: the processor Qwen3-VL was
    released with (transformers 4.57) replaces the chat template's whole
    ``<|vision_start|><|video_pad|><|vision_end|>`` by the runs, and so does transformers
    from 5.25 on (5.0-5.24 kept the outer pair, two tokens the released model never saw)."""

    runs: tuple[tuple[str, int], ...]  # (text before the run, its placeholder tokens)

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.runs)


# Placeholder tokens per media item: a fixed count (images), or a function of the item
# (audio: its length, read from the file header) called as f(ref, where), which may also
# lay the item out in runs (``ItemRuns``).
MediaTokenCount = Union[int, Callable[[MediaRef, str], Union[int, ItemRuns]]]


def _item_tag(tokenizer, modality: str):
    """The tokenizer's tags around items of ``modality``, or None."""
    lookup = getattr(tokenizer, "item_tag", None)
    return None if lookup is None else lookup(modality)


def _check_untagged(text: str, match, tag, where: str) -> None:
    """A record whose text already wraps a placeholder in the tags would get them twice."""
    before, after = text[:match.start()].rstrip(), text[match.end():].lstrip()
    if before.endswith(tag.start) or after.startswith(tag.end):
        raise DataRecordError(
            f"{where}: its text already wraps {match.group(0)} in {tag.start} ... {tag.end}, "
            f"which the data path adds around every item; remove them from the record's "
            f"text, or pass --image-tag-type none to keep the record's own")


def _append_text(text: str, loss: bool, out: TokenizedRecord, tokenizer: MultimodalTokenizer,
                 counts: dict[str, MediaTokenCount], where: str, record: Record,
                 seen: dict[str, int]) -> None:
    """Tokenize `text` segment by segment; each placeholder becomes counts[m] media ids (no
    loss), between its modality's item tags when the tokenizer has them (no loss either).
    `seen` counts the items of each modality placed so far (in appearance order)."""
    by_placeholder = {m.placeholder: name for name, m in MODALITIES.items()}
    pos = 0
    for match in placeholder_pattern().finditer(text):
        ids = tokenizer.tokenize(text[pos:match.start()])
        out.ids += ids
        out.is_loss += [loss] * len(ids)
        name = by_placeholder[match.group(0)]
        n = counts.get(name)
        index = seen.get(name, 0)
        seen[name] = index + 1
        if callable(n):
            n = n(record.media[name][index], where)
        runs = n.runs if isinstance(n, ItemRuns) else (("", n),)
        if not runs or any(not isinstance(k, int) or k < 1 for _, k in runs):
            raise DataRecordError(f"{where}: uses {match.group(0)} but "
                                  f"media_token_counts[{name!r}] is {n!r} (need a positive int)")
        tag = _item_tag(tokenizer, name)
        if tag is not None:
            _check_untagged(text, match, tag, where)
        item = _item_ids(runs, tokenizer.media_token_id(name), tag, tokenizer,
                         inner_tags=isinstance(n, ItemRuns))
        out.ids += item
        out.is_loss += [False] * len(item)
        out.items_end = len(out.ids)
        pos = match.end()
    ids = tokenizer.tokenize(text[pos:])
    out.ids += ids
    out.is_loss += [loss] * len(ids)


def _item_ids(runs, media_id: int, tag, tokenizer, inner_tags: bool) -> list[int]:
    """One item's ids: each run's text then its placeholders, between the item tags (when
    the tokenizer has them): around each run when ``inner_tags``, else around the whole."""
    ids = []
    for text, n in runs:
        ids += tokenizer.tokenize(text)
        run = [media_id] * n
        ids += [tag.start_id] + run + [tag.end_id] if tag is not None and inner_tags else run
    return [tag.start_id] + ids + [tag.end_id] if tag is not None and not inner_tags else ids


def tokenize_record(record: Record, tokenizer: MultimodalTokenizer,
                    media_token_counts: dict[str, MediaTokenCount]) -> TokenizedRecord:
    out = TokenizedRecord(ids=[tokenizer.bos_id], is_loss=[False], prompt_len=1, answer="")
    where = record.where()
    seen: dict[str, int] = {}
    if record.turns is not None:
        for human, gpt in zip(record.turns[0::2], record.turns[1::2]):
            _append_text(USER_PREFIX + human.text + ASSISTANT_PREFIX, False, out, tokenizer,
                         media_token_counts, where, record, seen)
            out.prompt_len = len(out.ids)
            _append_text(" " + gpt.text, True, out, tokenizer, media_token_counts, where,
                         record, seen)
            out.ids.append(tokenizer.eos_id)
            out.is_loss.append(True)
            out.answer = gpt.text.strip()
    else:
        text = record.text or ""
        _append_text(text, True, out, tokenizer, media_token_counts, where, record, seen)
        out.ids.append(tokenizer.eos_id)
        out.is_loss.append(True)
        # For captions the "prompt" is everything up to the last media item (its end tag).
        out.prompt_len = max(out.items_end, 1)
        tail = placeholder_pattern().split(text)[-1]
        out.answer = tail.strip()
    return out


def encode_record(record: Record, tokenizer: MultimodalTokenizer,
                  media_token_counts: dict[str, MediaTokenCount],
                  image_cfg: ImageProcessorConfig, max_seq_length: int | None = None,
                  audio_cfg: AudioProcessorConfig | None = None,
                  processors: dict | None = None) -> Sample:
    """Encode one record; raises DataRecordError if longer than `max_seq_length` (no
    truncation) or if an item does not suit its encoder. ``processors`` (modality ->
    ``media_processors`` processor, the model's encoder families) decode the media (and
    one with ``position_ids`` gives the sample its M-RoPE positions);
    without them, fixed-size images (`image_cfg`) and, given `audio_cfg`, Whisper clips."""
    if processors is None:
        processors = default_processors(media_token_counts, image_cfg, audio_cfg)
    tr = tokenize_record(record, tokenizer, media_token_counts)
    if max_seq_length is not None and len(tr.ids) > max_seq_length:
        # a processor may say why (InternVL: each image's tiles, the --max-num-tiles to use)
        advice = "".join(p.overflow_advice(record, len(tr.ids), max_seq_length)
                         for p in processors.values() if hasattr(p, "overflow_advice"))
        raise DataRecordError(f"{record.where()}: {len(tr.ids)} tokens exceed max_seq_length="
                              f"{max_seq_length}" + (advice or " (reduce media_token_counts "
                                                               "or drop the record)"))
    media: dict[str, torch.Tensor] = {}
    for name, refs in record.media.items():
        if name in processors:
            media.update(processors[name].load(refs, record.where()))
        elif refs:
            raise DataRecordError(f"{record.where()}: has {name} items but the model has no "
                                  f"{name} encoder" + (" (--audio-model-type whisper)"
                                                       if name == "audio" else ""))
    for proc in processors.values():  # every sample carries every key: batches collate
        for key, empty in proc.load([], "").items():
            media.setdefault(key, empty)

    position_ids = None
    for proc in {id(p): p for p in processors.values()}.values():  # e.g. M-RoPE's
        positions = getattr(proc, "position_ids", None)
        if positions is not None:
            position_ids = positions(tr.ids, media, tokenizer.media_token_id, record.where())

    tokens = torch.tensor(tr.ids, dtype=torch.long)
    labels = torch.full_like(tokens, tokenizer.pad_id)
    labels[:-1] = tokens[1:]
    loss_mask = torch.zeros(len(tr.ids), dtype=torch.float32)
    loss_mask[:-1] = torch.tensor(tr.is_loss[1:], dtype=torch.float32)
    return Sample(tokens=tokens, labels=labels, loss_mask=loss_mask, media=media,
                  prompt_len=tr.prompt_len, answer=tr.answer, record_id=record.id,
                  position_ids=position_ids)


def default_processors(media_token_counts: dict[str, MediaTokenCount],
                       image_cfg: ImageProcessorConfig,
                       audio_cfg: AudioProcessorConfig | None = None) -> dict:
    """Fixed-size images, and Whisper clips when ``audio_cfg`` is given."""
    procs = {"image": ImageProcessor(image_cfg, media_token_counts.get("image"))}
    if audio_cfg is not None:
        procs["audio"] = AudioProcessor(audio_cfg, media_token_counts.get("audio"))
    return procs


def sample_positions(sample: Sample, length: Optional[int] = None) -> torch.Tensor:
    """[3, length] int64 M-RoPE positions of ``sample`` (default: its own length).

    A sample without ``position_ids`` counts 0, 1, ... on all three axes (text). Positions
    past the sample (padding) continue as text after its largest position: max + 1, + 2,
    ... on every axis. Padding sits after the sample's tokens, which attend only backwards,
    and carries no loss, so its positions change nothing; counting on keeps them in the
    range the model sees anyway."""
    n = len(sample.tokens)
    length = n if length is None else length
    pos = sample.position_ids
    if pos is None:
        return torch.arange(length, dtype=torch.long).expand(3, -1).contiguous()
    if pos.shape != (3, n):
        raise ValueError(f"sample {sample.record_id!r}: position_ids of shape "
                         f"{tuple(pos.shape)}, expected (3, {n}) (one column per token)")
    start = int(pos.max()) + 1 if n else 0  # host tensors: the loader's
    tail = torch.arange(start, start + length - n, dtype=torch.long).expand(3, -1)
    return torch.cat([pos.long(), tail], dim=1)


def collate(samples: list[Sample], pad_id: int, pad_to_multiple_of: int = 1,
            seq_length: int | None = None) -> dict:
    """Right-pad samples into a batch.

    Length is `seq_length` if given (fixed shapes), else the longest sample, then
    rounded up to `pad_to_multiple_of`. media[m] concatenates samples in batch
    order, each in appearance order: the model fills media positions in
    row-major (batch, position) order with features in this order.

    ``position_ids`` is [B, L] (0..L-1 per row), or [3, B, L] when a sample carries
    M-RoPE positions (``sample_positions``: padding counts on after each sample).
    """
    if not samples:
        raise ValueError("collate() got an empty list of samples")
    longest = max(len(s.tokens) for s in samples)
    if seq_length is not None and longest > seq_length:
        raise ValueError(f"a sample has {longest} tokens > seq_length={seq_length}")
    length = seq_length if seq_length is not None else longest
    length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
    b = len(samples)
    tokens = torch.full((b, length), pad_id, dtype=torch.long)
    labels = torch.full((b, length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((b, length), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.tokens)
        tokens[i, :n], labels[i, :n], loss_mask[i, :n] = s.tokens, s.labels, s.loss_mask
    names = list(dict.fromkeys(k for s in samples for k in s.media))  # audio_frames too
    media = {m: torch.cat([s.media[m] for s in samples if m in s.media]) for m in names}
    if any(s.position_ids is not None for s in samples):
        positions = torch.stack([sample_positions(s, length) for s in samples], dim=1)
    else:
        positions = torch.arange(length, dtype=torch.long).unsqueeze(0).expand(b, -1).contiguous()
    return {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": positions,
        "media": media,
        "prompt_lens": [s.prompt_len for s in samples],
        "answers": [s.answer for s in samples],
        "record_ids": [s.record_id for s in samples],
        "seq_lengths": torch.tensor([len(s.tokens) for s in samples]),  # padding left out
    }
