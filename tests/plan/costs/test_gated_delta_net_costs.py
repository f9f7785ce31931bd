"""Gated DeltaNet layers in the cost model: FLOPs by hand, against Megatron-LM's own
formula (read from the installed Megatron-LM, no torch), O(S) growth, activation bytes."""

import ast
import dataclasses
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from megatron_mm.plan.costs import flops
from megatron_mm.plan.costs.gated_delta_net import delta_rule_flops
from megatron_mm.plan.errors import PlanError
from megatron_mm.plan.model import LinearAttentionSpec, TransformerSpec, linear_attention_pattern

TINY = LinearAttentionSpec(linear_conv_kernel_dim=4, linear_key_head_dim=2,
                           linear_value_head_dim=3, linear_num_key_heads=1,
                           linear_num_value_heads=2, chunk_size=4)


def hybrid(la=TINY, pattern=(1, 0), **kw):
    base = dict(hidden_size=8, num_layers=len(pattern), ffn_hidden_size=16,
                num_attention_heads=2, gated_linear_unit=True, vocab_size=32,
                linear_attention=la, linear_attention_freq=list(pattern))
    return TransformerSpec(**{**base, **kw})


def test_gated_delta_net_layer_by_hand():
    t = hybrid()
    cost = flops.llm_layer(t, 0, sequences=1, seq_len=10)
    # h 8, qk = 1 x 2, v = 2 x 3, 2 value heads: in_proj 8 x (4 + 12 + 4), conv 4 x (4 + 6),
    # out_proj 6 x 8; SwiGLU MLP 3 x 8 x 16
    linear = 2 * 10 * (8 * 20 + 4 * 10 + 6 * 8 + 3 * 8 * 16)
    # delta rule, C = 4, dk 2, dv 3: per chunk and head 2*16*(6+6) + 6*4*2*3 + 3*4*7/3 = 556;
    # 10 tokens are 3 chunks (padded), 2 heads
    rule = 3 * 2 * 556
    assert cost.fwd == linear + rule
    assert (cost.dgrad, cost.wgrad) == (linear + 2 * rule, linear)  # the rule has no weights
    # in_proj, conv, out_proj, A_log + dt_bias (2 x 2), the gated norm (3), two RMSNorms (8 each)
    assert cost.params == 8 * 20 + 4 * 10 + 6 * 8 + 4 + 3 + 3 * 8 * 16 + 2 * 8
    # kept per token (bf16): 2h, conv in/out 2 x 10, q/k at 2 heads 2 x 2 x 2, z and v 12,
    # beta/alpha 4, fp32 decay/beta 8, fp32 WY 2 x 4 x 2, output and norm output 12; MLP 2h + 3f
    assert cost.act == 2 * 10 * (16 + 20 + 8 + 12 + 4 + 8 + 16 + 12 + 16 + 48)
    # the layer input is all a recomputed layer keeps
    assert cost.recompute_act == cost.out == 2 * 10 * 8
    attention, mlp = flops.transformer_sublayers(t, 1, 10, True, linear=True)
    assert attention.fwd + mlp.fwd == cost.fwd and attention.params + mlp.params == cost.params
    assert attention.act + mlp.act == cost.act


def test_full_attention_layer_with_output_gate_by_hand():
    t = hybrid(attention_output_gate=True)
    cost = flops.llm_layer(t, 1, 1, 10)  # layer 1: full attention, heads of 4, q = kv = 8
    weights = 8 * (8 + 8) + 2 * 8 * 8 + 8 * 8  # q + gate, k, v, output
    assert cost.fwd == 2 * 10 * (weights + 3 * 8 * 16) + 4 * 10 * 10 * 8 * 0.5


def megatron_lm_flops():
    """Megatron-LM's ``num_floating_point_operations`` from its source (importing
    megatron.training would pull in torch and CUDA-only modules)."""
    spec = importlib.util.find_spec("megatron")  # a namespace package: nothing runs
    path = Path(list(spec.submodule_search_locations)[0]) / "training" / "training.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name == "num_floating_point_operations")
    scope = {"is_hybrid_model": lambda args: False,
             "is_linear_attention_variant": lambda v: v == "gated_delta_net"}
    exec(compile(ast.Module([fn], []), str(path), "exec"), scope)
    return scope["num_floating_point_operations"]


def megatron_args(t: TransformerSpec, seq: int, variant):
    la = t.linear_attention or LinearAttentionSpec()
    return SimpleNamespace(
        num_layers=t.num_layers, hidden_size=t.hidden_size, ffn_hidden_size=t.ffn_hidden_size,
        num_attention_heads=t.num_attention_heads, num_query_groups=t.num_query_groups,
        group_query_attention=True, kv_channels=t.kv_channels, swiglu=True,
        padded_vocab_size=t.vocab_size, seq_length=seq, num_experts=None, moe_layer_freq=1,
        moe_router_topk=1, moe_ffn_hidden_size=None, moe_latent_size=None,
        moe_shared_expert_intermediate_size=None, mtp_num_layers=None,
        multi_latent_attention=False, attention_output_gate=t.attention_output_gate,
        experimental_attention_variant=variant, linear_attention_freq=list(
            t.linear_attention_freq) or None,
        **{f.name: getattr(la, f.name) for f in dataclasses.fields(la)})


def planner_flops(t: TransformerSpec, batch: int, seq: int) -> float:
    layers = [flops.llm_layer(t, i, batch, seq) for i in range(t.num_layers)]
    head = flops.llm_head(t, batch * seq)
    return sum(c.fwd + c.dgrad + c.wgrad for c in layers) + head.fwd + head.dgrad + head.wgrad


def test_against_megatron_lm_formula():
    """Qwen3.5-27B's sizes: Megatron-LM's count and the planner's agree exactly on the
    all-attention model and, for the hybrid, on everything but the delta rule, where
    Megatron-LM charges 4 state products of dv^2 per token and head and no chunk term."""
    mlm = megatron_lm_flops()
    la = LinearAttentionSpec(linear_num_value_heads=48)
    t = TransformerSpec(hidden_size=5120, num_layers=8, ffn_hidden_size=17408,
                        num_attention_heads=24, num_query_groups=4, kv_channels=256,
                        gated_linear_unit=True, vocab_size=248320, attention_output_gate=True,
                        linear_attention=la, linear_attention_freq=linear_attention_pattern(4, 8))
    full = dataclasses.replace(t, linear_attention=None, linear_attention_freq=[])
    batch, seq = 2, 4096
    assert planner_flops(full, batch, seq) == pytest.approx(
        mlm(megatron_args(full, seq, None), batch), rel=1e-12)
    linear_layers = sum(t.linear_attention_freq)
    tokens = batch * seq
    theirs_rule = 3 * 2 * la.linear_num_value_heads * la.linear_value_head_dim ** 2 * 4
    ours_rule = 3 * delta_rule_flops(la, batch, seq)
    assert planner_flops(t, batch, seq) - linear_layers * ours_rule == pytest.approx(
        mlm(megatron_args(t, seq, "gated_delta_net"), batch)
        - linear_layers * tokens * theirs_rule, rel=1e-12)
    # the chunked rule's intra-chunk matmuls: 1.40 x Megatron-LM's rule at C 64, d 128
    assert ours_rule / (tokens * theirs_rule) == pytest.approx(1.3953, abs=1e-4)


def test_gated_delta_net_is_linear_in_the_sequence():
    t = hybrid(pattern=(1, 0))
    for s in (8, 64, 256):  # whole chunks
        lin, lin2 = flops.llm_layer(t, 0, 1, s), flops.llm_layer(t, 0, 1, 2 * s)
        assert lin2.fwd == 2 * lin.fwd and lin2.act == 2 * lin.act
        full, full2 = flops.llm_layer(t, 1, 1, s), flops.llm_layer(t, 1, 1, 2 * s)
        assert full2.fwd > 2 * full.fwd  # its score pairs: S^2
    # a partial chunk is computed whole
    assert flops.llm_layer(t, 0, 1, 9).fwd - flops.llm_layer(t, 0, 1, 8).fwd > \
        flops.llm_layer(t, 0, 1, 10).fwd - flops.llm_layer(t, 0, 1, 9).fwd


def test_pattern_and_bad_specs():
    assert linear_attention_pattern(4, 8) == [1, 1, 1, 0, 1, 1, 1, 0]  # Megatron-LM's rule
    assert hybrid(pattern=(0, 1)).is_linear(1) and not hybrid(pattern=(0, 1)).is_linear(0)
    with pytest.raises(PlanError, match="one 0/1 per layer"):
        hybrid(pattern=(1, 2))
    with pytest.raises(PlanError, match="needs both"):
        hybrid(la=None)
    with pytest.raises(PlanError, match="multiple of --linear-num-key-heads"):
        LinearAttentionSpec(linear_num_key_heads=3, linear_num_value_heads=4)
    assert TransformerSpec.from_json(hybrid().to_json()) == hybrid()
