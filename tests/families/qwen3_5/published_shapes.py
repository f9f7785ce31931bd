"""Small configs of the published Qwen3.6 / Qwen3.8 shapes (each loads as Qwen3.5's
architecture): every field of the published ``config.json`` kept (the MTP fields, the
``mamba_ssm_dtype``, ``full_attention_interval``, 262,144 positions, rope theta 1e7, a
quarter of each head rotated by interleaved M-RoPE, no DeepStack), the sizes scaled down
with their ratios kept: the 3 : 1 Gated DeltaNet : gated attention pattern, the value heads
per key head of GDN (3 for the 27B models, 2 for 35B-A3B), the query heads per key / value
head of attention (6 and 8), the shared expert as wide as a routed one (35B-A3B). A real
checkpoint also holds the MTP head's tensors (``mtp.*``, which transformers leaves
unloaded): ``mtp_tensors`` makes a few of them."""

import torch

from tiny_qwen3_5 import END, IMAGE, PATCH, START, VIDEO, VOCAB

# The published sizes (model cards; the 27B's config.json), for the doc and the tests.
PUBLISHED = {
    "Qwen3.6-27B": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=24,
                        num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                        linear_num_value_heads=48, intermediate_size=17408),
    "Qwen3.6-35B-A3B": dict(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                            num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                            linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
                            moe_intermediate_size=512, shared_expert_intermediate_size=512),
}
PUBLISHED["Qwen3.8-27B"] = PUBLISHED["Qwen3.6-27B"]  # the same structure (see docs)
CONTEXT = 262144
ROPE_THETA = 10_000_000
PATTERN = ["linear_attention"] * 3 + ["full_attention"]


def _text(dense: bool, groups: int, q_heads: int, kv_heads: int, v_heads: int) -> dict:
    sizes = (dict(intermediate_size=96) if dense else
             dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                  shared_expert_intermediate_size=16, norm_topk_prob=True,
                  router_aux_loss_coef=0.001, mlp_only_layers=[]))
    return dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4 * groups,
        num_attention_heads=q_heads, num_key_value_heads=kv_heads, head_dim=32,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=v_heads,
        layer_types=PATTERN * groups, full_attention_interval=4,
        max_position_embeddings=CONTEXT, rms_norm_eps=1e-6, hidden_act="silu",
        attention_bias=False, attention_dropout=0.0, attn_output_gate=True,
        mamba_ssm_dtype="float32", mtp_num_hidden_layers=1,
        mtp_use_dedicated_embeddings=False, partial_rotary_factor=0.25,
        tie_word_embeddings=False, use_cache=True,
        # 8 of 32 dims rotated: 4 frequencies, T H W dealt in turn (published: 11 11 10 of 32)
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True,
                         "partial_rotary_factor": 0.25},
        **sizes)


# name -> (architecture, text fields)
SHAPES = {
    "Qwen3.6-27B": ("Qwen3_5", _text(True, 1, q_heads=6, kv_heads=1, v_heads=6)),
    "Qwen3.6-35B-A3B": ("Qwen3_5Moe", _text(False, 1, q_heads=8, kv_heads=1, v_heads=4)),
    "Qwen3.8-27B": ("Qwen3_5", _text(True, 2, q_heads=6, kv_heads=1, v_heads=6)),
}


def config(name: str):
    import transformers

    kind, text = SHAPES[name]
    cfg = getattr(transformers, f"{kind}Config")(
        text_config=dict(text),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                           out_hidden_size=64, patch_size=PATCH, num_position_embeddings=16,
                           hidden_act="gelu_pytorch_tanh", in_channels=3,
                           spatial_merge_size=2, temporal_patch_size=2,
                           deepstack_visual_indexes=[]),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END, tie_word_embeddings=False)
    cfg.architectures = [f"{kind}ForConditionalGeneration"]
    return cfg


def mtp_tensors(cfg) -> dict:
    """A few tensors of the kind a published checkpoint's MTP head holds."""
    h = cfg.get_text_config().hidden_size
    gen = torch.Generator().manual_seed(3)
    return {"mtp.fc.weight": torch.randn(h, 2 * h, generator=gen),
            "mtp.norm.weight": torch.randn(h, generator=gen),
            "mtp.pre_fc_norm_embedding.weight": torch.randn(h, generator=gen),
            "mtp.pre_fc_norm_hidden.weight": torch.randn(h, generator=gen),
            "mtp.layers.0.input_layernorm.weight": torch.randn(h, generator=gen)}
