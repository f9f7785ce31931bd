"""One place picks the LLM's core attention (models/attention_choice.py): TE's own kernels
for plain causal masks, FlexAttention for the other masks and our CP split on CUDA, the
local path elsewhere and for CPU training; --attention-backend forces one, and what cannot
run here is an error naming the flag."""

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.models.attention_choice import choose_attention
from megatron_mm.models.flex_attention import FlexAttention
from megatron_mm.models.specs import get_layer_specs

GPU = dict(transformer_impl="transformer_engine", te_importable=True, cuda=True)
CPU = dict(transformer_impl="local", te_importable=False, cuda=False)


def kind(backend="auto", cp=1, machine=GPU, **mask):
    return choose_attention(backend, cp, **machine, **mask).kind


def test_auto_by_mask_family_and_device():
    # plain causal: the layers' own kernel (TE's fused / flash); TE's CP on zigzag
    assert kind() == "none"
    assert kind(cp=2, assignment="zigzag") == "transformer_engine"
    # every other mask, and our balanced CP split, on FlexAttention on CUDA
    for mask in (dict(media_attention="bidirectional"),
                 dict(media_attention="bidirectional", packed=True)):
        assert kind(**mask) == "flex"
        assert kind(cp=4, **mask) == "flex"
    assert kind(cp=2) == "flex"  # causal, our assignment
    assert kind(packed=True) == "none"  # packed causal samples on TE: THD
    assert kind(packed=True, machine={**GPU, "transformer_impl": "local"}) == "flex"
    # CPU training: the local path (dense mask, einsum CP attention), and the log says why
    choice = choose_attention("auto", 1, **CPU, media_attention="bidirectional")
    assert choice.kind == "none" and "FlexAttention backward on CPU" in choice.reason
    assert kind(cp=2, machine=CPU, media_attention="bidirectional") == "ours"
    # no dropout in FlexAttention: the local path
    assert kind(media_attention="bidirectional", attention_dropout=0.1) == "none"


def test_forced_backends():
    assert kind("flex") == "flex"  # causal too
    # FlexAttention on CPU where no gradient is needed (validation, generation)
    assert kind("flex", cp=2, machine=CPU, training=False) == "flex"
    assert kind("local", cp=2, machine={**GPU, "transformer_impl": "local"}) == "ours"
    assert kind("unfused", media_attention="bidirectional") == "none"  # TE, arbitrary mask


@pytest.mark.parametrize("backend, change, message", [
    ("flex", dict(machine=CPU), "--attention-backend flex cannot train here: no CUDA device"),
    ("flex", dict(attention_dropout=0.1), "--attention-dropout 0.1"),
    ("flex", dict(cp=2, cp_comm_type="a2a"), "--cp-comm-type a2a"),
    ("flash", dict(machine=CPU), "--attention-backend flash .* --transformer-impl "
                                 "transformer_engine"),
    ("local", dict(), "--attention-backend local .* --transformer-impl local"),
    ("sdpa", dict(), "--attention-backend must be one of"),
])
def test_what_cannot_run_names_the_flag(backend, change, message):
    with pytest.raises(ConfigError, match=message):
        kind(backend, **change)


def test_flex_specs_at_any_cp_size():
    for cp in (False, True):
        specs = get_layer_specs("local", context_parallel=cp, cp_attention="flex",
                                media_attention="bidirectional")
        core = specs.language_layer.submodules.self_attention.submodules.core_attention
        assert core is FlexAttention
