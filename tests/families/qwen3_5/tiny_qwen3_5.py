"""Tiny random Qwen3.5-shaped Hugging Face models (hybrid LLM: Gated DeltaNet layers 0 and
2, gated full attention with a quarter-head rotary at 1 and 3) and the batch their tests
run: Qwen3-VL's (two images of different sizes, a two-frame clip with timestamps)."""

import importlib.util
import os

import torch

_spec = importlib.util.spec_from_file_location(
    "tiny_qwen3_vl", os.path.join(os.path.dirname(__file__), "..", "qwen3_vl",
                                  "tiny_qwen3_vl.py"))
_vl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_vl)
VOCAB, IMAGE, VIDEO, START, END, SEQ, PATCH = (_vl.VOCAB, _vl.IMAGE, _vl.VIDEO, _vl.START,
                                               _vl.END, _vl.SEQ, _vl.PATCH)
inputs = _vl.inputs
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]


# Qwen3.5-MoE's text fields: 4 experts of 24 (top 2) and a shared expert of 40 per layer.
MOE_TEXT = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                shared_expert_intermediate_size=40)


def config(text=None, moe: bool = False, **vision):
    """``transformers.Qwen3_5Config`` (``moe``: ``Qwen3_5MoeConfig``): a 2-layer tower (no
    DeepStack), a 4-layer hybrid LLM (head 32, a quarter rotated: M-RoPE sections 2 1 1,
    interleaved; GDN with 2 key and 4 value heads of 16); ``text`` / ``vision`` override
    fields."""
    import transformers

    kind = "Qwen3_5Moe" if moe else "Qwen3_5"
    text = {**(MOE_TEXT if moe else {}), **(text or {})}
    cfg = getattr(transformers, f"{kind}Config")(
        text_config={**dict(vocab_size=VOCAB, hidden_size=64,
                            **({} if moe else dict(intermediate_size=128)),
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-5,
                            linear_conv_kernel_dim=4, linear_key_head_dim=16,
                            linear_value_head_dim=16, linear_num_key_heads=2,
                            linear_num_value_heads=4, layer_types=LAYER_TYPES,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                             "mrope_section": [2, 1, 1],
                                             "mrope_interleaved": True,
                                             "partial_rotary_factor": 0.25}),
                     **(text or {})},
        vision_config={**dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                              out_hidden_size=64, patch_size=PATCH,
                              num_position_embeddings=16), **vision},
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END, tie_word_embeddings=False)
    cfg.architectures = [f"{kind}ForConditionalGeneration"]
    return cfg


def tiny(cfg):
    """Qwen3-VL's tiny weights (random norms, sharp attention), and GDN decays and gates
    spread out (A_log, dt_bias random) so that a state crossing a boundary shows."""
    model = _vl.tiny(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("A_log"):
                p.uniform_(-2.0, 0.5)
            if n.endswith("dt_bias"):
                p.normal_(0.0, 1.0)
    return model
