"""Frozen-aware backward: which parts run, and what a layer costs in forwards F."""

import pytest

from megatron_mm.plan import TransformerSpec, Workload, build_chain, resolve_backward
from megatron_mm.plan.costs.flops import transformer_layer, transformer_sublayers
from megatron_mm.plan.model import EncoderSpec, ModelSpec

from helpers import layer, vlm_chain


def ratios(chain, kind):
    return {l.total_flops / l.fwd_flops for l in chain if l.kind == kind}


def test_frozen_encoders_and_llm_behind_trained_projector():
    chain = vlm_chain(3, 4, freeze_vit=True, freeze_proj=False, freeze_llm=True)
    assert ratios(chain, "vision_embed") == {1.0}
    assert ratios(chain, "vision_layer") == {1.0}  # nothing upstream trains: no backward
    assert ratios(chain, "projector") == {2.0}  # weight grads only: its input is frozen
    assert ratios(chain, "llm_layer") == {2.0}  # input grads only, back to the projector
    assert ratios(chain, "llm_head") == {2.0}
    assert all(l.stored_act_bytes == 0 for l in chain if l.kind == "vision_layer")


def test_everything_trained_is_3F_except_what_has_no_trainable_input():
    chain = vlm_chain(3, 4, freeze_vit=False, freeze_proj=False, freeze_llm=False)
    assert ratios(chain, "vision_embed") == {2.0}  # first layer: its input is data
    for kind in ("vision_layer", "projector", "llm_layer", "llm_head"):
        assert ratios(chain, kind) == {3.0}


def test_fully_frozen_llm_behind_frozen_projector_has_no_backward():
    chain = vlm_chain(2, 3, freeze_vit=True, freeze_proj=True, freeze_llm=False)
    assert ratios(chain, "vision_layer") == {1.0} and ratios(chain, "projector") == {1.0}
    embed = next(l for l in chain if l.kind == "llm_embed")
    assert embed.trainable and not embed.needs_dgrad  # nothing upstream of it trains
    assert ratios(chain, "llm_layer") == {3.0}  # the trainable embedding is upstream


@pytest.mark.parametrize("freeze_vit,freeze_llm,vit,llm", [
    (True, True, 1.0, 3.0),  # frozen ViT: no backward, nothing to recompute; LLM 2F + F
    (False, False, 4.0, 4.0),
    (False, True, 4.0, 3.0),
])
def test_recompute_adds_a_forward_only_where_backward_runs(freeze_vit, freeze_llm, vit, llm):
    chain = vlm_chain(2, 3, freeze_vit=freeze_vit, freeze_llm=freeze_llm, recompute=True)
    assert ratios(chain, "vision_layer") == {vit}
    assert ratios(chain, "llm_layer") == {llm}


def test_upstream_follows_dataflow_not_chain_order():
    # vision (trained projector) then audio (all frozen) then the LLM: the audio encoder is
    # after the vision projector in the chain but does not consume it
    chain = [layer("llm_embed", trainable=False),
             layer("vision_layer", 0, trainable=False), layer("projector", 0),
             layer("audio_layer", 0, branch="audio", trainable=False),
             layer("audio_layer", 1, branch="audio", trainable=False),
             layer("projector", 1, branch="audio", trainable=False),
             layer("llm_layer", 0, trainable=False), layer("llm_head", trainable=False)]
    chain = resolve_backward(chain)
    # the embedding is upstream of the merge, not behind it: no input gradient there
    assert [l.needs_dgrad for l in chain] == [False, False, False, False, False, False,
                                              True, True]
    assert [l.total_flops for l in chain] == [1, 1, 2, 1, 1, 1, 2, 2]


def test_transformer_layer_backward_split():
    # linear part P has dgrad = wgrad = P; the attention core A (no weights) only dgrad 2A
    t = TransformerSpec(hidden_size=64, num_layers=1, ffn_hidden_size=256,
                        num_attention_heads=4, num_query_groups=2, gated_linear_unit=True)
    c = transformer_layer(t, sequences=3, seq_len=32, causal=True)
    h, kv, f, tokens = 64, 32, 256, 96
    linear = 2 * tokens * (2 * h * h + 2 * h * kv + 3 * h * f)  # GQA attn + SwiGLU
    core = 4 * 3 * 32 * 32 * h / 2  # causal halves it
    assert c.wgrad == linear and c.fwd == linear + core and c.dgrad == linear + 2 * core
    assert c.fwd + c.dgrad + c.wgrad == 3 * c.fwd  # a trained layer costs exactly 3F
    full = transformer_layer(t, sequences=3, seq_len=32, causal=False)
    assert full.fwd - linear == 2 * core


@pytest.mark.parametrize("bias, glu, experts", [(False, True, 1), (True, False, 1),
                                                (False, True, 4)])
def test_attention_and_mlp_kernels_add_up_to_the_layer(bias, glu, experts):
    """Sub-layer pieces (Optimus' kernels): the attention and the MLP halves of a layer
    together cost what the layer does, the attention core all in the first."""
    t = TransformerSpec(hidden_size=64, num_layers=1, ffn_hidden_size=256,
                        num_attention_heads=4, num_query_groups=2, gated_linear_unit=glu,
                        add_bias_linear=bias, num_experts=experts,
                        moe_router_topk=2 if experts > 1 else 1)
    layer = transformer_layer(t, sequences=3, seq_len=32, causal=False)
    attention, mlp = transformer_sublayers(t, sequences=3, seq_len=32, causal=False)
    for field in ("fwd", "dgrad", "wgrad", "params", "act"):
        assert getattr(attention, field) + getattr(mlp, field) == pytest.approx(
            getattr(layer, field)), field
    assert attention.dgrad - attention.wgrad == 2 * 4 * 3 * 32 * 32 * 64  # its core: 2A
    assert mlp.dgrad == mlp.wgrad == mlp.fwd


def test_build_chain_modules_tokens_and_freezing():
    vit = TransformerSpec(hidden_size=32, num_layers=2, ffn_hidden_size=64,
                          num_attention_heads=2)
    llm = TransformerSpec(hidden_size=64, num_layers=3, ffn_hidden_size=128,
                          num_attention_heads=4, vocab_size=100)
    enc = EncoderSpec(name="vision", modality="vision", transformer=vit, tokens_per_item=17,
                      llm_tokens_per_item=16, items_per_sample=2)
    model = ModelSpec(name="tiny", encoders=[enc], llm=llm, frozen_encoders=["vision"],
                      freeze_llm=True)
    chain = build_chain(model, Workload(seq_length=50, micro_batch_size=2))
    assert [l.module for l in chain] == [
        "language_model.embedding", "vision_model", "vision_model.decoder.layers.0",
        "vision_model.decoder.layers.1", "vision_projection", "language_model.decoder.layers.0",
        "language_model.decoder.layers.1", "language_model.decoder.layers.2",
        "language_model.output_layer"]
    enc_layer = transformer_layer(vit, sequences=4, seq_len=17, causal=False)
    assert chain[2].fwd_flops == enc_layer.fwd  # 2 samples x 2 images of 17 tokens
    assert chain[5].fwd_flops == transformer_layer(llm, 2, 50, causal=True).fwd
    assert [l.trainable for l in chain] == [False] * 4 + [True] + [False] * 4
    tp2 = build_chain(model, Workload(seq_length=50, micro_batch_size=2,
                                      tensor_model_parallel_size=2))
    assert tp2[5].fwd_flops == chain[5].fwd_flops / 2 and tp2[5].params == chain[5].params / 2
