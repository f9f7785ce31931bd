"""The Qwen3.5 demo's tokenizer (``digits_tokenizer.model``): a SentencePiece BPE trained
on the text of the Qwen demos' digits data, every merge it has (476 pieces with Qwen's two
vision tags; 512 ids padded, with the three media tokens).

Why not the other demos' Mistral v1 tokenizer: its 32,000 pieces make the demo's embedding
table 4.1 M of its 5.6 M parameters (128 wide), and on CPU a step's cost is then largely
that table's, not the model's: the output layer over 32,128 logits, the optimizer's
element-wise passes, the gradient's zeroing and all-reduce. The digits' text needs a few
dozen pieces. Byte fallback keeps any other text (a user's records) exact. Qwen's vision
tags are single pieces, so (``--image-tag-type auto``) every image and temporal patch sits
between ``<|vision_start|>`` and ``<|vision_end|>`` as Qwen3.5's chat template writes it.

The file is generated (deterministically: one thread, a fixed corpus) and checked in:

    python -m megatron_mm.data.digits_tokenizer --out DIR
"""
from __future__ import annotations

import argparse
import io
import os
from pathlib import Path

from .digits import IMAGE_QUESTION, VIDEO_QUESTION, WORDS
from .item_tags import IMAGE_TAGS
from .processing import ASSISTANT_PREFIX, USER_PREFIX

MODEL = Path(__file__).with_name("digits_tokenizer.model")
VOCAB_LIMIT = 509  # + <image>, <audio>, <video>: at most 512, a multiple of Megatron's 128


def corpus() -> list[str]:
    """The prompts around the media placeholders, every answer of one or two digits, and
    the clips' timestamps (``<t seconds>``), each with the weight the data gives it."""
    lines = []
    for question in (IMAGE_QUESTION, VIDEO_QUESTION):
        lines += [USER_PREFIX, f"\n{question}{ASSISTANT_PREFIX}"] * 50
    lines += [" " + " ".join((a, b)) for a in WORDS for b in WORDS]
    lines += [f"<{t / 4:.1f} seconds>" for t in range(41)] * 5
    return lines


def train(vocab_size: int = VOCAB_LIMIT) -> bytes:
    """The serialized model: Llama / Mistral's options (identity normalisation, a dummy
    prefix, byte fallback, digits split) so ``MultimodalTokenizer`` tokenizes it literally."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=model, model_type="bpe",
        vocab_size=vocab_size, byte_fallback=True, character_coverage=1.0,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        user_defined_symbols=list(IMAGE_TAGS["qwen-vl"]),
        num_threads=1, hard_vocab_limit=False, minloglevel=2)
    return model.getvalue()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(MODEL.parent), help="output directory")
    args = p.parse_args(argv)
    path, model = os.path.join(args.out, MODEL.name), train()
    with open(path, "wb") as f:
        f.write(model)
    print(path)


if __name__ == "__main__":
    main()
