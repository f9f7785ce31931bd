"""A Hugging Face fast tokenizer (``tokenizer.json``) with MultimodalTokenizer's interface.

Carried inside converted checkpoints (Qwen2's byte-level BPE, for example). Loaded with
the ``tokenizers`` library alone. Tokenization is literal (no special tokens added), as
the data pipeline needs, for byte-level BPE tokenizers; a SentencePiece model
(``tokenizer.model``, Llama / Mistral) goes through MultimodalTokenizer instead.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from .item_tags import ItemTag, TagRequest, resolve_tags


def _token_text(value) -> Optional[str]:
    return value.get("content") if isinstance(value, dict) else value


class HuggingFaceTokenizer:
    def __init__(self, path: str | os.PathLike, image_token_id: Optional[int] = None,
                 audio_token_id: Optional[int] = None, video_token_id: Optional[int] = None,
                 item_tags: Optional[TagRequest] = None):
        from tokenizers import Tokenizer

        self.path, self.image_token_id = os.fspath(path), image_token_id
        self.audio_token_id, self.video_token_id = audio_token_id, video_token_id
        file = os.path.join(self.path, "tokenizer.json")
        if not os.path.isfile(file):
            raise FileNotFoundError(f"--tokenizer-model {self.path}: no tokenizer.json there")
        self._tok = Tokenizer.from_file(file)
        config_file = os.path.join(self.path, "tokenizer_config.json")
        config = json.load(open(config_file)) if os.path.isfile(config_file) else {}
        ids = {key: self._id(_token_text(config.get(f"{key}_token")))
               for key in ("bos", "eos", "pad")}
        if ids["eos"] is None:
            raise ValueError(f"{config_file}: no eos_token (the end-of-answer token)")
        self.eos_id = ids["eos"]
        # Qwen-style tokenizers have no BOS: a sample then starts with EOS (a separator).
        self.bos_id = self.eos_id if ids["bos"] is None else ids["bos"]
        self.pad_id = self.eos_id if ids["pad"] is None else ids["pad"]
        image = image_token_id if image_token_id is not None else self._id("<image>")
        self._media_ids = {} if image is None else {"image": image}
        audio = audio_token_id
        for name in ("<|AUDIO|>", "<audio>"):  # Qwen2-Audio's, or ours
            if audio is None:
                audio = self._id(name)
        if audio is not None:
            self._media_ids["audio"] = audio
        video = video_token_id
        for name in ("<|video_pad|>", "<video>"):  # Qwen2-VL / Qwen2.5-VL's, or ours
            if video is None:
                video = self._id(name)
        if video is not None:
            self._media_ids["video"] = video
        self.base_vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # The vocabulary is the checkpoint's: a tag it lacks is never invented.
        self.tag_request = item_tags
        self.item_tags, self.missing_tags = resolve_tags(item_tags, self.token_id)

    def _id(self, token: Optional[str]) -> Optional[int]:
        return None if token is None else self._tok.token_to_id(token)

    def __getstate__(self) -> dict:
        return {"path": self.path, "image_token_id": self.image_token_id,
                "audio_token_id": self.audio_token_id, "video_token_id": self.video_token_id,
                "item_tags": self.tag_request}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["image_token_id"], state.get("audio_token_id"),
                      state.get("video_token_id"), state.get("item_tags"))

    @property
    def vocab_size(self) -> int:
        return max([self.base_vocab_size] + [i + 1 for i in self._media_ids.values()])

    def token_id(self, text: str) -> Optional[int]:
        """The id of the single token ``text`` (an added token such as ``<img>``), or None."""
        return self._tok.token_to_id(text)

    def item_tag(self, modality: str) -> Optional[ItemTag]:
        """The tokens around each item of ``modality`` (None: no tags)."""
        return self.item_tags.get(modality)

    @property
    def eod(self) -> int:
        return self.eos_id

    def media_token_id(self, modality: str) -> int:
        if modality not in self._media_ids:
            raise KeyError(f"the tokenizer in {self.path} has no {modality} token; pass "
                           f"--{modality}-token-id")
        return self._media_ids[modality]

    def tokenize(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids if text else []

    def detokenize(self, ids) -> str:
        media = set(self._media_ids.values())
        return self._tok.decode([int(i) for i in ids if int(i) not in media],
                                skip_special_tokens=True)
