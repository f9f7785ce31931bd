"""The Qwen3.5 demo's tokenizer: the checked-in model is what its generator trains (the same
pieces, in order), it reads the digits data literally (every prompt, answer and timestamp
back exactly, each answer word one piece, nothing unknown, Qwen's vision tags around each
item), and byte fallback keeps other text exact; the demo's recipe uses it and its
vocabulary pads to 512."""

import pytest
import sentencepiece as spm

from megatron_mm.data.digits import WORDS
from megatron_mm.data.item_tags import IMAGE_TAGS, tag_request
from megatron_mm.data.tokenizer import build_tokenizer
from megatron_mm.families.qwen3_vl.encoder import QWEN3_VL
from megatron_mm.data.digits_tokenizer import MODEL, corpus, train


def pieces(processor):
    return [(processor.id_to_piece(i), processor.get_score(i))
            for i in range(processor.get_piece_size())]


@pytest.mark.slow
def test_checked_in_model_is_the_generated_one():
    generated = spm.SentencePieceProcessor(model_proto=train())
    assert pieces(generated) == pieces(spm.SentencePieceProcessor(model_file=str(MODEL)))


def test_digits_text_reads_back_exactly():
    tok = build_tokenizer("SentencePiece", str(MODEL), item_tags=tag_request("auto", [QWEN3_VL]))
    assert tok._literal and tok.vocab_size <= 512
    for text in set(corpus()) | {"héllo, wörld\t2026 ✓"}:
        ids = tok.tokenize(text)
        assert tok.detokenize(ids) == text and tok._sp.unk_id() not in ids, text
    assert all(len(tok.tokenize(" " + word)) == 1 for word in WORDS)
    assert {m: (t.start, t.end) for m, t in tok.item_tags.items()} == {
        "image": IMAGE_TAGS["qwen-vl"], "video": IMAGE_TAGS["qwen-vl"]}


def test_demo_recipe_uses_it():
    from megatron_mm.training.cli.arguments import read_args

    args = read_args(["--recipe", "demo_qwen35"], world_size=2)
    assert (args.tokenizer_type, args.tokenizer_model) == ("SentencePiece", str(MODEL))
