"""Offline SentencePiece tokenizer with one special token per media modality.

Default model: the Llama/Mistral-7B-v0.1 tokenizer (`tokenizer.model.v1`, 32,000
pieces) shipped inside the `mistral-common` wheel, so no Hub access is needed.
"""
from __future__ import annotations

import importlib.util
import json
import os
from functools import lru_cache

import sentencepiece as spm

from .item_tags import ItemTag, TagRequest, resolve_tags
from .records import MODALITIES

MISTRAL_COMMON_PIP = "pip install --no-deps mistral-common==1.13.1"
# A newline is a byte-fallback piece in Llama-style models, so no BPE merge can
# cross it: encoding "\n" + text and dropping the "\n" ids gives `text` without
# SentencePiece's dummy-prefix space (same idea as HF LlamaTokenizer legacy=False).
_SENTINEL = "\n"


def default_tokenizer_model() -> str:
    """Path of mistral-common's `tokenizer.model.v1`, located without importing the package."""
    spec = importlib.util.find_spec("mistral_common")
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "data", "tokenizer.model.v1")
        if os.path.exists(path):
            return path
    raise FileNotFoundError(
        "The default tokenizer (mistral_common/data/tokenizer.model.v1) is not installed. "
        f"Install it with: {MISTRAL_COMMON_PIP}  "
        "(or pass --tokenizer-model PATH to a SentencePiece .model)")


class MultimodalTokenizer:
    """SentencePiece text tokenizer + media tokens appended after the base vocab.

    `tokenize` is *literal*: it never inserts the dummy-prefix space, so segments
    tokenized separately (text around placeholders) concatenate to the exact text,
    and `detokenize(tokenize(s)) == s` for Llama-style models.
    """

    def __init__(self, model_path: str | os.PathLike, image_token_id: int | None = None,
                 audio_token_id: int | None = None, video_token_id: int | None = None,
                 item_tags: TagRequest | None = None):
        self.model_path, self.image_token_id = os.fspath(model_path), image_token_id
        self.audio_token_id, self.video_token_id = audio_token_id, video_token_id
        self.tag_request = item_tags
        self._sp = spm.SentencePieceProcessor(model_file=self.model_path)
        self.base_vocab_size = self._sp.vocab_size()
        self.bos_id = self._sp.bos_id()
        self.eos_id = self._sp.eos_id()
        self.pad_id = self._sp.pad_id() if self._sp.pad_id() >= 0 else self.eos_id
        self._media_ids = {name: self.base_vocab_size + i for i, name in enumerate(MODALITIES)}
        if image_token_id is not None:  # a converted checkpoint's (LLaVA-1.5: 32000)
            self._media_ids["image"] = image_token_id
        if audio_token_id is not None:  # a converted checkpoint's (Qwen2-Audio: <|AUDIO|>)
            self._media_ids["audio"] = audio_token_id
        if video_token_id is not None:  # a converted checkpoint's (Qwen2.5-VL: <|video_pad|>)
            self._media_ids["video"] = video_token_id
        self._added = _hf_added_tokens(self.model_path)
        # Tags asked for by name that the vocabulary lacks go after the media tokens.
        self._appended = {}
        if item_tags is not None and item_tags.required:
            first = self.base_vocab_size + len(MODALITIES)
            for name in item_tags.names():
                if self.token_id(name) is None:
                    self._appended[name] = first + len(self._appended)
        self.item_tags, self.missing_tags = resolve_tags(item_tags, self.token_id)
        self._sentinel_ids = self._sp.encode(_SENTINEL)
        # Models that normalise whitespace away cannot tokenize literally; fall back.
        self._literal = bool(self._sentinel_ids) and all(
            self._sp.encode(_SENTINEL + p)[: len(self._sentinel_ids)] == self._sentinel_ids
            for p in ("x", " x", "=", "\n"))
        self._encode = lru_cache(maxsize=65536)(self._encode_uncached)  # prompts repeat a lot

    # SentencePiece processors and lru_cache wrappers do not pickle; rebuild from the
    # path so the tokenizer can go to spawn/forkserver DataLoader workers.
    def __getstate__(self) -> dict:
        return {"model_path": self.model_path, "image_token_id": self.image_token_id,
                "audio_token_id": self.audio_token_id, "video_token_id": self.video_token_id,
                "item_tags": self.tag_request}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_path"], state.get("image_token_id"),
                      state.get("audio_token_id"), state.get("video_token_id"),
                      state.get("item_tags"))

    @property
    def vocab_size(self) -> int:
        """Base vocabulary + one id per modality (e.g. <image> = 32000 for Mistral v1), then
        the item tags appended after them (only when asked for by name)."""
        ids = list(self._media_ids.values()) + list(self._appended.values()) + [
            i for t in self.item_tags.values() for i in (t.start_id, t.end_id)]
        return max(self.base_vocab_size + len(self._media_ids) + len(self._appended),
                   max(ids) + 1)

    def token_id(self, text: str) -> int | None:
        """The id of the single token ``text``: a Hugging Face added token of the model's
        directory, a piece of the model, or a tag appended after the media tokens."""
        if text in self._added:
            return self._added[text]
        if text in self._appended:
            return self._appended[text]
        i = self._sp.piece_to_id(text)
        return i if i != self._sp.unk_id() and self._sp.id_to_piece(i) == text else None

    def item_tag(self, modality: str) -> ItemTag | None:
        """The tokens around each item of ``modality`` (None: no tags)."""
        return self.item_tags.get(modality)

    @property
    def eod(self) -> int:  # Megatron's name for the end-of-document id
        return self.eos_id

    def media_token_id(self, modality: str) -> int:
        if modality not in self._media_ids:
            raise KeyError(f"unknown modality {modality!r}; known: {list(self._media_ids)}")
        return self._media_ids[modality]

    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        if not text:
            return ()
        if self._literal:
            ids = self._sp.encode(_SENTINEL + text)
            k = len(self._sentinel_ids)
            if ids[:k] == self._sentinel_ids:
                return tuple(ids[k:])
        return tuple(self._sp.encode(text))

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS/EOS, no dummy-prefix space, placeholders not special)."""
        return list(self._encode(text))

    def detokenize(self, ids) -> str:
        """Text of `ids`, skipping media, BOS/EOS/pad and other control ids."""
        ids = [int(i) for i in ids]
        ids = [i for i in ids if 0 <= i < self.base_vocab_size and not self._sp.is_control(i)]
        if self._literal:  # decode after the sentinel so a leading space is kept
            out = self._sp.decode(self._sentinel_ids + ids)
            if out.startswith(_SENTINEL):
                return out[len(_SENTINEL):]
        return self._sp.decode(ids)


def _hf_added_tokens(model_path: str) -> dict[str, int]:
    """Hugging Face's added tokens beside a converted checkpoint's ``tokenizer.model``
    (``added_tokens.json``, ``tokenizer_config.json``'s ``added_tokens_decoder``): where
    InternVL's ``<img>`` / ``<IMG_CONTEXT>`` live for a SentencePiece LLM."""
    if os.path.basename(model_path) != "tokenizer.model":
        return {}
    folder, added = os.path.dirname(model_path), {}
    path = os.path.join(folder, "added_tokens.json")
    if os.path.isfile(path):
        with open(path) as f:
            added.update({str(k): int(v) for k, v in json.load(f).items()})
    path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            decoder = json.load(f).get("added_tokens_decoder") or {}
        added.update({v["content"]: int(k) for k, v in decoder.items()})
    return added


# Megatron-LM's --tokenizer-type names of the same tokenizers (a checkpoint saved by
# Megatron-LM's pretrain with the package's model names its tokenizer so)
MEGATRON_LM_TOKENIZERS = {"SentencePieceTokenizer": "SentencePiece",
                          "GPTSentencePieceTokenizer": "SentencePiece",
                          "HuggingFaceTokenizer": "HuggingFaceTokenizer"}


def build_tokenizer(tokenizer_type: str = "MistralV1SentencePiece",
                    tokenizer_model: str | os.PathLike | None = None,
                    image_token_id: int | None = None, audio_token_id: int | None = None,
                    video_token_id: int | None = None, item_tags: TagRequest | None = None):
    """Factory: "MistralV1SentencePiece" (default model, or `tokenizer_model` to override),
    "SentencePiece" (requires `tokenizer_model`, any SentencePiece .model file) or
    "HuggingFaceTokenizer" (a directory with tokenizer.json). `image_token_id` (audio,
    video) overrides the placeholder's id (converted checkpoints have their own);
    `item_tags` (``item_tags.tag_request``): the tokens around each media item.
    Megatron-LM's names (``MEGATRON_LM_TOKENIZERS``) name the same tokenizers."""
    tokenizer_type = MEGATRON_LM_TOKENIZERS.get(tokenizer_type, tokenizer_type)
    if tokenizer_type == "MistralV1SentencePiece":
        return MultimodalTokenizer(tokenizer_model or default_tokenizer_model(), image_token_id,
                                   audio_token_id, video_token_id, item_tags)
    if tokenizer_type in ("SentencePiece", "HuggingFaceTokenizer"):
        if tokenizer_model is None:
            raise ValueError(f"tokenizer_type={tokenizer_type!r} needs tokenizer_model=PATH")
        if tokenizer_type == "SentencePiece":
            return MultimodalTokenizer(tokenizer_model, image_token_id, audio_token_id,
                                       video_token_id, item_tags)
        from .hf_tokenizer import HuggingFaceTokenizer

        return HuggingFaceTokenizer(tokenizer_model, image_token_id, audio_token_id,
                                    video_token_id, item_tags)
    raise ValueError(f"unknown tokenizer_type {tokenizer_type!r}; expected "
                     "'MistralV1SentencePiece', 'SentencePiece' or 'HuggingFaceTokenizer'")
