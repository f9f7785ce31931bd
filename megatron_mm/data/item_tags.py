"""Tokens around each media item's placeholder run (``<img>`` ... ``</img>``), Megatron-LM's
``--image-tag-type``.

Megatron-LM (examples/multimodal) surrounds every ``<image>`` of a record's text with the
tags of ``--image-tag-type`` (``nvlm``: ``<Image>``/``</Image>``, ``internvl``:
``<img>``/``</img>``; default ``""``: none) before expanding the image tokens. Hugging
Face's processors do the same per item: ``InternVLProcessor`` expands each image into
``<img>`` + tiles x 256 ``<IMG_CONTEXT>`` + ``</img>``, Qwen2.5-VL's chat template writes
``<|vision_start|><|image_pad|><|vision_end|>`` (``<|video_pad|>`` for a video) and its
processor expands the pad. A model imported from Hugging Face must be fine-tuned on the same
layout, so here the default is ``auto``: the encoder family's own tags
(``EncoderFamily.item_tags``) where the tokenizer has those tokens. The tags are prompt
input: never a loss target, text positions for M-RoPE, counted in every length.

Torch-free: the argument parser and the tokenizers read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

# Megatron-LM's IMAGE_TAGS, and Qwen-VL's vision tags.
IMAGE_TAGS: Dict[str, Tuple[str, str]] = {
    "nvlm": ("<Image>", "</Image>"),
    "internvl": ("<img>", "</img>"),
    "qwen-vl": ("<|vision_start|>", "<|vision_end|>"),
}
AUTO, NONE = "auto", "none"
# "" is Megatron-LM's spelling of "no tags"
TAG_TYPES = (AUTO, NONE, "") + tuple(IMAGE_TAGS)
FLAG = "--image-tag-type"


@dataclass(frozen=True)
class ItemTag:
    """The tokens around one modality's items: their text and ids."""

    start: str
    end: str
    start_id: int
    end_id: int


@dataclass(frozen=True)
class TagRequest:
    """Which tokens to wrap each modality's items in (modality -> (start, end) text), and
    whether they were asked for by name (``required``: a tokenizer that lacks them adds them
    after its vocabulary if it can (SentencePiece), else it is an error naming ``flag``);
    otherwise (``auto``) a modality whose tokens the tokenizer lacks goes untagged."""

    tokens: Mapping[str, Tuple[str, str]]
    required: bool = False
    flag: str = f"{FLAG} {AUTO}"

    def names(self) -> Tuple[str, ...]:
        """Every tag token, in modality order, each once."""
        return tuple(dict.fromkeys(t for pair in self.tokens.values() for t in pair))


NO_TAGS = TagRequest({}, False, f"{FLAG} {NONE}")


def tag_request(tag_type: str, families) -> TagRequest:
    """The request of ``--image-tag-type`` for a model of these encoder ``families``.

    ``auto``: each family's own ``item_tags`` (every family, audio included); ``none`` / "":
    none; a named style: its tags around every item of the vision families (images, and
    videos where the family reads them)."""
    if tag_type in (NONE, ""):
        return NO_TAGS
    if tag_type == AUTO:
        tokens = {m: pair for f in families for m, pair in (f.item_tags or {}).items()}
        return TagRequest(tokens, False, f"{FLAG} {AUTO}")
    if tag_type not in IMAGE_TAGS:
        raise ValueError(f"{FLAG} {tag_type!r}: expected one of {', '.join(TAG_TYPES[:2])}, "
                         f"{', '.join(IMAGE_TAGS)} (or \"\": none)")
    pair = IMAGE_TAGS[tag_type]
    tokens = {m: pair for f in families if f.slot == "vision" for m in f.modalities}
    return TagRequest(tokens, True, f"{FLAG} {tag_type}")


def resolve_tags(request: Optional[TagRequest], token_id) -> Tuple[Dict[str, ItemTag], list]:
    """(modality -> ItemTag, the tokens an ``auto`` request found missing) from
    ``token_id(text) -> id or None`` (the tokenizer's lookup). A required token that is
    missing is a ``MissingTagToken``."""
    tags, missing = {}, []
    if request is None:
        return tags, missing
    for modality, (start, end) in request.tokens.items():
        ids = token_id(start), token_id(end)
        absent = [t for t, i in zip((start, end), ids) if i is None]
        if absent and request.required:
            raise MissingTagToken(request.flag, absent[0])
        if absent:
            missing += [t for t in absent if t not in missing]
            continue
        tags[modality] = ItemTag(start, end, ids[0], ids[1])
    return tags, missing


class MissingTagToken(ValueError):
    """A required tag token the tokenizer has no id for."""

    def __init__(self, flag: str, token: str):
        self.flag, self.token = flag, token
        super().__init__(f"{flag}: the tokenizer has no token {token!r}; use a tokenizer "
                         f"that has it (a converted checkpoint's) or pass {FLAG} {NONE}")


def describe(tags: Mapping[str, ItemTag], missing, request: Optional[TagRequest]) -> str:
    """One line for the log: the tags in use, and those ``auto`` left out."""
    if request is None or not request.tokens:
        return f"media item tags: none ({request.flag if request else FLAG + ' ' + NONE})"
    used = ", ".join(f"{m}: {t.start} ... {t.end}" for m, t in tags.items()) or "none"
    line = f"media item tags: {used} ({request.flag})"
    if missing:
        line += (f"; left out: the tokenizer has no {', '.join(missing)} (name a style, "
                 f"e.g. {FLAG} internvl, to add them to a SentencePiece vocabulary)")
    return line
