"""M-RoPE in the language model: the text part of Qwen2.5-VL (and Qwen2-VL) against
transformers, given the same 3-D position ids, and the flags its config maps to."""

import pytest
import torch

from megatron_mm.hf.errors import ConversionError
from megatron_mm.hf.families import language_flags

VOCAB = 250
SEQ = 14
# head dim 16: 8 rotary frequencies, split 2 / 3 / 3 over time, height and width
_TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
             rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})


def _hf_model(arch: str):
    import transformers
    from transformers import AutoConfig

    model_type = {"Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
                  "Qwen2VLForConditionalGeneration": "qwen2_vl"}[arch]
    config = AutoConfig.for_model(model_type, text_config=_TEXT, tie_word_embeddings=False,
                                  vision_config=dict(depth=1, hidden_size=32, num_heads=2,
                                                     embed_dim=32, out_hidden_size=64))
    torch.manual_seed(0)
    model = getattr(transformers, arch)(config).eval()
    with torch.no_grad():  # random norms and biases: a mapping mix-up cannot hide
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
            if "language_model" in n and ("q_proj" in n or "k_proj" in n):
                p.mul_(8.0)  # sharp attention: the rotation angles show in the logits
    return model


def _positions(batch: int, seq: int) -> torch.Tensor:
    """[3, B, S] positions unequal across the three axes (text, then a 2 x 3 image grid,
    then text, as Qwen2-VL lays them out), different per row."""
    rows = []
    for b in range(batch):
        t = torch.arange(seq).expand(3, -1).clone()
        start = 2 + b
        grid = torch.arange(6)
        t[0, start:start + 6] = start
        t[1, start:start + 6] = start + grid // 3
        t[2, start:start + 6] = start + grid % 3
        t[:, start + 6:] = start + 3 + torch.arange(seq - start - 6)
        rows.append(t)
    return torch.stack(rows, dim=1)


@pytest.mark.parametrize("arch", ["Qwen2_5_VLForConditionalGeneration",
                                  "Qwen2VLForConditionalGeneration"])
def test_mrope_language_model_matches_transformers(gloo_world, arch):
    """Our GPTModel with --position-embedding-type mrope, built from the flags the text
    config maps to and filled through the language weight table, gives transformers'
    logits on 3-D positions (max |diff| <= 1e-4, fp32)."""
    from megatron_mm.hf.compare import logits
    from megatron_mm.hf.convert import _build, _context, _run_config
    from megatron_mm.hf.mapping import MappingTable, prefixed
    from megatron_mm.hf.tables import LANGUAGE, OUTPUT_LAYER

    hf = _hf_model(arch)
    flags = language_flags(hf.config.get_text_config(), "text_config.",
                           tie_word_embeddings=hf.config.tie_word_embeddings)
    assert flags["position_embedding_type"] == "mrope"
    assert flags["mrope_section"] == [2, 3, 3]
    run = _run_config({**flags, "vision_model_type": "none", "seq_length": 64,
                       "train_iters": 0})
    config = run.model_config
    lm = config.language
    lm.vocab_size = VOCAB
    lm.padded_vocab_size = lm.vocab_size_padded(1)
    ours = _build(config, run.model).eval()
    rules = (prefixed(LANGUAGE, "language_model.", "model.language_model.")
             + prefixed(OUTPUT_LAYER, "language_model.", ""))
    expected = {k: v for k, v in ours.state_dict().items() if torch.is_tensor(v)}
    mapped, _ = MappingTable(rules).to_megatron(hf.state_dict(), expected,
                                                _context(config, VOCAB))
    ours.load_state_dict({**ours.state_dict(), **mapped}, strict=True)

    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    positions = _positions(2, SEQ)
    with torch.no_grad():
        ref = hf.lm_head(hf.model.language_model(input_ids=tokens,
                                                 position_ids=positions).last_hidden_state)
        got = logits(ours, tokens, None, positions)[..., :VOCAB]
        text_only = logits(ours, tokens, None)  # 0..S-1 on every axis
    diff = (got - ref).abs().max().item()
    assert diff <= 1e-4, diff
    # The positions matter: the same tokens at text positions give other logits.
    assert (text_only[..., :VOCAB] - ref).abs().max().item() > 1e-3  # 10x the tolerance


def test_mrope_equals_rope_on_text_positions(gloo_world):
    """Equal rows (text) rotate as RoPE does: the same weights give the same loss."""
    from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig
    from megatron_mm.models import BuildSettings, build_model

    def build(**kw):
        cfg = MultimodalModelConfig(encoders={}, language=LanguageModelConfig(
            vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_query_groups=2, **kw))
        torch.manual_seed(0)
        return build_model(cfg, BuildSettings(), {})

    rope, mrope = build(), build(position_embedding_type="mrope", mrope_section=(4, 2, 2))
    mrope.load_state_dict(rope.state_dict())
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(SEQ).expand(2, -1)
    with torch.no_grad():
        torch.testing.assert_close(mrope(tokens, pos.expand(3, -1, -1)), rope(tokens, pos),
                                   rtol=0, atol=1e-5)


def test_language_flags_mrope_section():
    from transformers import AutoConfig

    text = AutoConfig.for_model("qwen2_5_vl_text", **{**_TEXT, "rope_scaling": None})
    flags = language_flags(text, "text_config.", tie_word_embeddings=True)
    # transformers' default split when the config names none
    assert flags["mrope_section"] == [16, 24, 24]
    assert flags["add_qkv_bias"]
    assert not flags["untie_embeddings_and_output_weights"]
    llama = AutoConfig.for_model("llama", hidden_size=64, num_attention_heads=4,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                  "mrope_section": [2, 3, 3]})
    with pytest.raises(ConversionError, match="mrope_section"):
        language_flags(llama)
    assert "position_embedding_type" not in language_flags(
        AutoConfig.for_model("qwen2", hidden_size=64, num_attention_heads=4))
