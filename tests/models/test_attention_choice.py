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


def test_lora_attends_with_flex_on_cuda():
    # LoRA needs the local layers, whose own attention materialises the scores: on CUDA
    # FlexAttention takes every mask, the plain causal one too; CPU training keeps the
    # local path, a forced backend stays forced
    local = {**GPU, "transformer_impl": "local"}
    assert kind(machine=local) == "none"
    choice = choose_attention("auto", 1, **local, lora=True)
    assert choice.kind == "flex" and "LoRA" in choice.reason
    assert kind(machine=local, lora=True, media_attention="bidirectional") == "flex"
    assert kind(machine=local, lora=True, packed=True) == "flex"
    assert kind(machine=CPU, lora=True) == "none"
    assert kind(machine=local, lora=True, attention_dropout=0.1) == "none"
    assert kind("local", machine=local, lora=True) == "none"


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


# Transformer Engine's get_attention_backend (dot_product_attention/utils.py, TE 2.9-2.18),
# copied from its comment table "attn_mask_type | attention_mask | supported backends"
# (self-attention rows) and the lines after it: `if attn_mask_type == "arbitrary": ...
# use_flash_attention = False ... use_fused_attention = False`; and its dtype filter
# `if qkv_dtype not in [torch.bfloat16, torch.float16]` (FlashAttention; FusedAttention
# likewise, plus FP8).
TE_SOURCE_TABLE = {
    "no_mask": "All", "padding": "All", "causal": "All", "padding_causal": "All",
    "causal_bottom_right": "All", "padding_causal_bottom_right": "All",
    "arbitrary": "UnfusedDotProductAttention",
}


def test_te_rules_as_tes_source_states_them():
    from megatron_mm.models.te_attention_rules import KERNEL_NAMES, TE_KERNELS, te_kernels

    for mask, supported in TE_SOURCE_TABLE.items():
        names = {KERNEL_NAMES[k] for k in te_kernels(mask, half_precision=True)}
        assert names == ({KERNEL_NAMES[k] for k in TE_KERNELS} if supported == "All"
                         else {supported}), mask
        assert te_kernels(mask, half_precision=False) == ("unfused",), mask  # fp32


@pytest.mark.parametrize("backend", ["flash", "fused", "unfused"])
def test_a_pinned_te_kernel_is_one_te_enables_for_the_mask(backend):
    """Every layout a pinned TE kernel is accepted for declares a mask (the LLM's layer
    spec: ``te_attention_mask``, THD for packed causal samples) that TE enables that
    kernel for; the others are one error naming the flag. --attention-backend flash with
    bidirectional media once gave TE's 'arbitrary' mask, for which TE has no flash or
    fused kernel: the first forward failed with no backend."""
    from megatron_mm.models.specs import uses_thd
    from megatron_mm.models.te_attention_mask import language_attn_mask_type
    from megatron_mm.models.te_attention_rules import te_kernels

    accepted = refused = 0
    for media in ("causal", "bidirectional"):
        for packed in (False, True):
            for cp, assignment in ((1, "ours"), (2, "ours"), (2, "zigzag")):
                for half in (True, False):
                    try:
                        choice = choose_attention(backend, cp, **GPU, media_attention=media,
                                                  packed=packed, assignment=assignment,
                                                  half_precision=half)
                    except ConfigError as e:
                        assert f"--attention-backend {backend}" in str(e)
                        refused += 1
                        continue
                    accepted += 1
                    assert backend in te_kernels("no_mask", half)  # the encoders' masks
                    if choice.kind == "ours":  # our CP attention: no TE kernel in the LLM
                        continue
                    context_parallel = cp > 1 and choice.kind != "none"
                    mask = ("padding_causal" if uses_thd("transformer_engine", media, packed,
                                                         context_parallel)
                            else language_attn_mask_type("transformer_engine", media,
                                                         context_parallel).name)
                    assert backend in te_kernels(mask, half), (media, packed, cp, mask)
    assert accepted and (refused > 0) == (backend != "unfused")
    with pytest.raises(ConfigError, match="disables for the LLM's 'arbitrary' mask"):
        kind(backend if backend != "unfused" else "flash", media_attention="bidirectional")
    with pytest.raises(ConfigError, match="bf16 / fp16 inputs only: pass --bf16"):
        choose_attention("fused", 1, **GPU, half_precision=False)


def test_lora_flags_pick_flex_on_cuda(monkeypatch):
    import torch

    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.build_settings import cp_attention_choice
    from megatron_mm.training.config.run_config import RunConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for lora, want in (([], "none"), (["--lora-rank", "8"], "flex")):
        config = RunConfig.from_flags(parse_args(
            ["--transformer-impl", "local", "--bf16", *lora], world_size=1))
        assert cp_attention_choice(config).kind == want
