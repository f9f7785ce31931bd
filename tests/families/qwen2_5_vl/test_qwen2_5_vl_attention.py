"""The Qwen2.5-VL tower's two attention routes describe the same attention: TE's THD
cu_seqlens (window segments for window layers, per-frame segments for the full-attention
layers) turned into a block mask equal the local path's masks, on grids of several images
of different sizes (partial windows) and videos; the host builds every size, so the
device-side work (masks, THD params) reads no value back; the TE layer spec wires TE's
fused linears and the segmented core attention."""

import pytest
import torch

from megatron_mm.families.qwen2_5_vl.attention import (
    FULL,
    WINDOW,
    PreparedAttention,
    SegmentedAttention,
    VisionAttentionSegments,
)
from megatron_mm.families.qwen2_5_vl.grid import block_diagonal_mask, vision_grid_layout

# images of different sizes (some not a whole number of windows), a 3-frame and a 1-frame
# video; window 56 px = 2x2 merge units, 112 px = 4x4
CASES = [([(1, 8, 12), (1, 4, 4), (2, 4, 8)], 56),
         ([(1, 6, 10), (1, 12, 4), (1, 2, 2), (3, 4, 6), (1, 10, 14)], 56),
         ([(1, 6, 10), (2, 10, 14), (1, 2, 30)], 112)]


def thd_block_mask(params) -> torch.Tensor:
    """[P, P] bool, True where attention is allowed, from THD cu_seqlens alone (what TE's
    varlen kernel computes: each [cu[i], cu[i+1]) attends within itself)."""
    cu = params.cu_seqlens_q.tolist()
    allowed = torch.zeros(cu[-1], cu[-1], dtype=torch.bool)
    for start, end in zip(cu[:-1], cu[1:]):
        allowed[start:end, start:end] = True
    return allowed


@pytest.mark.parametrize("grids,window", CASES)
def test_thd_segments_equal_the_local_masks(grids, window):
    layout = vision_grid_layout(grids, 2, window, 14)
    prepared = PreparedAttention.from_seqlens(layout.window_seqlens, layout.frame_seqlens)
    masks = prepared.layer_inputs(thd=False)["attention_mask"]  # the local path's
    thd = prepared.layer_inputs(thd=True)
    assert thd["attention_mask"] is None
    segments = thd["packed_seq_params"]
    p = layout.num_patches
    assert masks.shape == (2, 1, p, p)
    for kind, params, seqlens in ((WINDOW, segments.window, layout.window_seqlens),
                                  (FULL, segments.full, layout.frame_seqlens)):
        assert params.qkv_format == "thd" and params.cu_seqlens_q.dtype == torch.int32
        assert params.cu_seqlens_q is params.cu_seqlens_kv
        assert params.max_seqlen_q == params.max_seqlen_kv == max(seqlens)
        assert isinstance(params.max_seqlen_q, int)  # TE needs no device read for it
        allowed = thd_block_mask(params)
        assert torch.equal(allowed, ~masks[kind, 0]), kind
        assert torch.equal(allowed, ~block_diagonal_mask(seqlens)[0, 0]), kind
    allowed_window, allowed_frame = thd_block_mask(segments.window), thd_block_mask(
        segments.full)
    assert not (allowed_window & ~allowed_frame).any()  # every window inside one frame
    assert allowed_window.sum() < allowed_frame.sum()  # and the windows do cut frames
    n_frames = sum(t for t, _, _ in grids)
    assert len(layout.frame_seqlens) == n_frames  # frames never attend to each other


def test_local_masks_isolate_the_sequence_parallel_padding():
    layout = vision_grid_layout([(1, 4, 4), (2, 4, 8)], 2, 56, 14)
    prepared = PreparedAttention.from_seqlens(layout.window_seqlens, layout.frame_seqlens)
    p, pad = layout.num_patches, 8
    masks = prepared.layer_inputs(thd=False, pad=pad)["attention_mask"]
    plain = prepared.layer_inputs(thd=False)["attention_mask"]
    assert torch.equal(masks[..., :p, :p], plain)
    assert masks[..., :p, p:].all() and masks[..., p:, :p].all()  # nobody reaches it
    assert not masks[..., p:, p:].any()  # the padding attends to itself
    assert prepared.layer_inputs(thd=False, pad=pad)["attention_mask"] is masks  # kept
    with pytest.raises(ValueError, match="--sequence-parallel needs --transformer-impl local"):
        prepared.layer_inputs(thd=True, pad=pad)


def test_device_side_reads_no_value():
    """Everything is sized on the host: on the meta device (where any read of a value
    fails) the batch moves, the masks are built and the THD params keep their sizes."""
    grids, window = CASES[1]
    layout = vision_grid_layout(grids, 2, window, 14)
    host = PreparedAttention.from_seqlens(layout.window_seqlens, layout.frame_seqlens)
    on_device = host.to("meta")
    masks = on_device.layer_inputs(thd=False)["attention_mask"]
    assert masks.device.type == "meta" and masks.shape[-1] == layout.num_patches
    segments = on_device.layer_inputs(thd=True)["packed_seq_params"]
    for params, seqlens in ((segments.window, layout.window_seqlens),
                            (segments.full, layout.frame_seqlens)):
        assert params.cu_seqlens_q.device.type == "meta"
        assert params.cu_seqlens_q.shape == (len(seqlens) + 1,)
        assert params.max_seqlen_q == max(seqlens)


class _Recorder(torch.nn.Module):
    """A stand-in core attention: records what ``SegmentedAttention`` hands it."""

    def __init__(self, **kwargs):
        super().__init__()
        self.calls = []

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        self.calls.append((tuple(query.shape), attention_mask, attn_mask_type,
                           packed_seq_params))
        return query.flatten(1)


def test_each_layer_kind_takes_its_segments():
    from megatron.core.transformer.enums import AttnMaskType

    layout = vision_grid_layout([(1, 4, 8), (2, 4, 4)], 2, 56, 14)
    segments = VisionAttentionSegments.from_seqlens(layout.window_seqlens,
                                                    layout.frame_seqlens)
    cls = type("Segmented", (SegmentedAttention, _Recorder), {})
    window, full = (cls(layer_number=n, full_attention_layers=frozenset({1})) for n in (1, 2))
    q = torch.randn(layout.num_patches, 1, 2, 8)
    for core, expected in ((window, segments.window), (full, segments.full)):
        out = core(q, q, q, None, attn_mask_type=AttnMaskType.padding,
                   packed_seq_params=segments)
        assert out.shape == (layout.num_patches, 1, 16)
        shape, mask, mask_type, params = core.calls[-1]
        assert shape == (layout.num_patches, 2, 8) and mask is None
        assert mask_type == AttnMaskType.padding and params is expected
    with pytest.raises(ValueError, match="VisionAttentionSegments"):
        window(q, q, q, None, packed_seq_params=segments.window)
    with pytest.raises(ValueError, match="no mask"):
        window(q, q, q, torch.ones(1, dtype=torch.bool), packed_seq_params=segments)


def test_te_layer_spec_wires_te_layers(monkeypatch):
    """On Megatron-Core's TE classes (placeholders here: TE is never installed on CPU) the
    spec fuses the pre-norms into TE's linears and the core attention is segmented TE."""
    from megatron.core.extensions import transformer_engine as te
    from megatron.core.transformer.identity_op import IdentityOp

    from megatron_mm.families.qwen2_5_vl.config import Qwen2_5VLVisionConfig
    from megatron_mm.families.qwen2_5_vl import attention as qwen2_5_vl_attention
    from megatron_mm.families.qwen2_5_vl import vision as qwen2_5_vl_vision

    class FakeTEDotProductAttention(torch.nn.Module):
        pass

    monkeypatch.setattr(te, "TEDotProductAttention", FakeTEDotProductAttention)
    monkeypatch.setattr(qwen2_5_vl_vision, "transformer_engine_importable", lambda: True)
    qwen2_5_vl_attention.te_segmented_attention.cache_clear()
    try:
        spec = qwen2_5_vl_vision.qwen2_5_vl_vision_layer_spec(
            Qwen2_5VLVisionConfig(num_layers=4, fullatt_block_indexes=(1, 3)),
            "transformer_engine")
    finally:
        qwen2_5_vl_attention.te_segmented_attention.cache_clear()
    sub = spec.submodules
    attn = sub.self_attention.submodules
    assert sub.input_layernorm is IdentityOp and sub.pre_mlp_layernorm is IdentityOp
    assert attn.linear_qkv is te.TELayerNormColumnParallelLinear
    assert attn.linear_proj is te.TERowParallelLinear
    core = attn.core_attention
    assert issubclass(core.module, SegmentedAttention)
    assert issubclass(core.module, FakeTEDotProductAttention)
    assert core.params == {"full_attention_layers": frozenset({1, 3})}
    mlp = sub.mlp.keywords["submodules"]
    assert mlp.linear_fc1 is te.TELayerNormColumnParallelLinear
    assert mlp.linear_fc2 is te.TERowParallelLinear


def test_te_without_transformer_engine_is_a_clear_error():
    from megatron_mm.config import ConfigError
    from megatron_mm.families.qwen2_5_vl.config import Qwen2_5VLVisionConfig
    from megatron_mm.families.qwen2_5_vl.vision import qwen2_5_vl_vision_layer_spec

    with pytest.raises(ConfigError, match="--transformer-impl local"):
        qwen2_5_vl_vision_layer_spec(Qwen2_5VLVisionConfig(), "transformer_engine")
