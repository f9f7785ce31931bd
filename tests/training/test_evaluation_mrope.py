"""Greedy decoding of an M-RoPE model (Qwen2.5-VL family): the prompt keeps its [3, S]
positions and each generated token gets the position the Hugging Face rule gives the
whole continued sequence (text after the largest position), so the answers equal a
decoding that recomputes every position from scratch."""
import numpy as np
import pytest
import torch

from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig
from megatron_mm.data import digits_qwen as dq
from megatron_mm.data.digits import load_digits_arrays, split_indices
from megatron_mm.data.media_processors import qwen_vl_processor
from megatron_mm.data.mrope_positions import sample_mrope_positions
from megatron_mm.data.processing import collate, encode_record
from megatron_mm.data.records import parse_record
from megatron_mm.data.tokenizer import build_tokenizer
from megatron_mm.encoders.qwen2_5_vl_config import Qwen2_5VLVisionConfig
from megatron_mm.training.evaluation import _extend, greedy_generate, prompt_of

ENC = Qwen2_5VLVisionConfig(hidden_size=32, num_layers=2, num_attention_heads=4,
                            fullatt_block_indexes=(1,), out_hidden_size=64,
                            min_pixels=28 * 28, max_pixels=84 * 84,
                            video_min_pixels=28 * 28, video_max_pixels=56 * 56)


class _Args:
    image_processor_config = None


@pytest.fixture(scope="module")
def setup():
    tok = build_tokenizer()
    image, video = qwen_vl_processor(_Args(), ENC)
    procs = {"image": image, "video": video}
    images, targets = load_digits_arrays()
    with pytest.MonkeyPatch.context() as mp:  # the first of each kind: 1-3 images, clips
        mp.setattr(dq, "NUM_RECORDS", {"valid": len(dq.KINDS)})
        records = dq.build_records("valid", images, targets, split_indices()[1])
    samples = [encode_record(parse_record(r), tok, {m: p.token_count for m, p in procs.items()},
                             None, 64, processors=procs) for r in records]
    return tok, image, [prompt_of(s) for s in samples]


def _positions(tok, proc, sample, ids):
    pos, _ = sample_mrope_positions(
        ids, image_token_id=tok.media_token_id("image"),
        video_token_id=tok.media_token_id("video"),
        image_grid_thw=sample.media["image_grid_thw"].tolist(),
        video_grid_thw=sample.media["video_grid_thw"].tolist(),
        second_per_grid_ts=sample.media["second_per_grid_ts"].tolist(),
        tokens_per_second=proc.tokens_per_second)
    return torch.from_numpy(pos).long()


def test_prompt_and_generated_positions_follow_the_rule(setup):
    tok, proc, prompts = setup
    compressed = 0
    for p in prompts:
        assert p.position_ids.shape == (3, p.prompt_len) == (3, len(p.tokens))
        ext = _extend(_extend(p, 11), 12)
        ids = p.tokens.tolist() + [11, 12]
        assert torch.equal(ext.position_ids, _positions(tok, proc, p, ids))
        compressed += int(ext.position_ids[0, -1] < len(ids) - 1)
    assert compressed  # items of several tokens: a token's position is not its index


def test_greedy_decoding_equals_recomputed_positions(setup, gloo_world):
    from megatron_mm.models import BuildSettings, build_model
    from megatron_mm.models.batch_layout import batch_layout

    tok, proc, prompts = setup
    cfg = MultimodalModelConfig(
        encoders={"vision": ENC},
        language=LanguageModelConfig(vocab_size=tok.vocab_size, hidden_size=64,
                                     num_attention_heads=4, position_embedding_type="mrope",
                                     mrope_section=(2, 3, 3)))
    torch.manual_seed(0)
    model = build_model(cfg, BuildSettings(), {m: tok.media_token_id(m)
                                               for m in ("image", "video")}).eval()
    for p in prompts[:3] + prompts[-1:]:  # 1 image, 2 and 3 images, a 4-frame clip
        got = greedy_generate([model], [p], tok.pad_id, 3, -1, tok.base_vocab_size)[0]
        ids = p.tokens.tolist()
        for _ in range(3):
            b = collate([p], tok.pad_id)
            tokens = torch.tensor([ids])
            layout = batch_layout(model.mm_config, model.media_token_ids, tokens, b["media"])
            with torch.no_grad():
                logits = model(tokens, _positions(tok, proc, p, ids).unsqueeze(1), b["media"],
                               layout=layout)
            ids.append(int(logits[0, -1, :tok.base_vocab_size].argmax()))
        assert got == ids[len(p.tokens):]
