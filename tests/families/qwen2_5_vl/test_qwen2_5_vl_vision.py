"""Qwen2.5-VL's vision encoder on Megatron-Core layers against Hugging Face's
``Qwen2_5_VisionTransformerPretrainedModel`` (tiny, random weights): two images of
different sizes and a 2-frame video in one forward, window and full-attention layers, the
weight table both ways, TP=2 equal to TP=1, and the host-built layout against Hugging
Face's own helpers."""

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")

from megatron_mm.config import ConfigError  # noqa: E402
from megatron_mm.families.qwen2_5_vl.grid import (  # noqa: E402
                                                  block_diagonal_mask,
                                                  vision_grid_layout,
                                                  )

TOLERANCE = 1e-5
# Two images of different sizes and a 2-frame video; window_size 56 px = 2x2 merge units,
# so the (1, 8, 12) image has 6 windows, the video 2 per frame.
GRIDS = [(1, 8, 12), (1, 4, 4), (2, 4, 8)]
HF_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                 out_hidden_size=64, window_size=56, fullatt_block_indexes=[1])
HEADS = {"vision": (4, 4)}


def _hf_tower():
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,
    )

    torch.manual_seed(0)
    model = Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**HF_VISION))
    with torch.no_grad():  # norms start at 1 and biases at 0: randomise them too
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def _inputs():
    gen = torch.Generator().manual_seed(1)
    patches = sum(t * h * w for t, h, w in GRIDS)
    pixels = torch.randn(patches, 3 * 2 * 14 * 14, generator=gen)
    weights = torch.randn(patches // 4, HF_VISION["out_hidden_size"], generator=gen)
    return pixels, weights


def _megatron_names(model):
    return {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}


def _table():
    from megatron_mm.hf.mapping import MappingTable
    from megatron_mm.families.qwen2_5_vl.hf_table import qwen2_5_vl_vision_rules

    return MappingTable(qwen2_5_vl_vision_rules())


def _build(hf_config, transformer_impl="local", layer_spec=None):
    from megatron_mm.families.qwen2_5_vl.vision import Qwen2_5VLVisionWithMerger
    from megatron_mm.families.qwen2_5_vl.config import Qwen2_5VLVisionConfig
    from megatron_mm.families.qwen2_5_vl.transformer_config import (
        qwen2_5_vl_merger_transformer_config,
        qwen2_5_vl_vision_transformer_config,
    )
    from megatron_mm.models.transformer_configs import BuildSettings

    enc = Qwen2_5VLVisionConfig.from_hf(hf_config)
    s = BuildSettings(tensor_model_parallel_size=_tp())
    return Qwen2_5VLVisionWithMerger(qwen2_5_vl_vision_transformer_config(enc, s),
                                     qwen2_5_vl_merger_transformer_config(enc, s), enc,
                                     transformer_impl, layer_spec)


def _tp():
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_world_size()


def _imported(hf_state, hf_config):
    """A Megatron model (this world's TP must be 1) with the Hugging Face weights."""
    from megatron_mm.hf.transforms import Context

    model = _build(hf_config)
    mapped, used = _table().to_megatron(hf_state, _megatron_names(model), Context(HEADS))
    assert used == set(hf_state), set(hf_state) - used  # every HF tensor has its place
    model.load_state_dict({**model.state_dict(), **mapped}, strict=True)
    return model


@pytest.fixture(scope="module")
def reference():
    """Hugging Face's merged tokens and the gradients of sum(out * weights)."""
    hf = _hf_tower()
    pixels, weights = _inputs()
    out = hf(pixels, torch.tensor(GRIDS)).pooler_output
    (out * weights).sum().backward()
    grads = {k: p.grad.clone() for k, p in hf.named_parameters()}
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    return dict(config=hf.config, state=state, out=out.detach(), grads=grads,
                pixels=pixels, weights=weights)


@pytest.fixture(scope="module")
def imported(gloo_world, reference):
    return _imported(reference["state"], reference["config"])


def test_output_and_gradients_equal_hugging_face(imported, reference):
    out = imported(reference["pixels"], GRIDS)
    diff = (out - reference["out"]).abs().max().item()
    print(f"Qwen2.5-VL vision, TP=1: max abs diff {diff:.3g} "
          f"(|out| max {reference['out'].abs().max().item():.3g})")
    assert out.shape == (sum(t * h * w for t, h, w in GRIDS) // 4, 64)
    assert diff <= TOLERANCE

    imported.zero_grad()
    (out * reference["weights"]).sum().backward()
    from megatron_mm.hf.transforms import Context

    expected, _ = _table().to_megatron(reference["grads"], _megatron_names(imported),
                                       Context(HEADS))  # the transforms are linear
    worst = 0.0  # relative to the tensor's largest gradient (they reach ~100 here)
    for name, p in imported.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
        scale = expected[name].abs().max().item()
        worst = max(worst, (p.grad - expected[name]).abs().max().item() / scale)
    print(f"max gradient diff relative to the largest gradient: {worst:.3g}")
    assert worst <= 1e-5


def test_items_attend_only_within_themselves(imported, reference):
    """Each item's tokens are the same alone as next to others (no leakage, no padding)."""
    pixels = reference["pixels"]
    with torch.no_grad():
        together = imported(pixels, GRIDS)
        start, tokens = 0, 0
        for grid in GRIDS:
            n = grid[0] * grid[1] * grid[2]
            alone = imported(pixels[start:start + n], [grid])
            assert torch.allclose(alone, together[tokens:tokens + n // 4], atol=1e-6), grid
            start, tokens = start + n, tokens + n // 4


def test_forward_and_backward_read_no_device_value(imported, reference):
    """With the grids prepared on the host (batch preparation), the step's model code
    reads nothing back from the device."""
    from host_syncs import HostSyncCounter

    batch = imported.prepare(GRIDS)
    counter = HostSyncCounter()
    with counter.active():
        out = imported(reference["pixels"], batch)
        (out * reference["weights"]).sum().backward()
    assert counter.found == []
    imported.zero_grad()


class ReferenceThdAttention(torch.nn.Module):
    """TE's THD varlen attention on the CPU: q / k / v [t, heads, dim]; each cu_seqlens
    segment attends within itself (device ops only: nothing is read back)."""

    def __init__(self, config, layer_number, **kwargs):
        super().__init__()
        self.kinds = []

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        assert packed_seq_params.qkv_format == "thd" and attention_mask is None
        self.kinds.append(packed_seq_params.max_seqlen_q)
        t = query.shape[0]
        cu = packed_seq_params.cu_seqlens_q.long()
        segment = torch.searchsorted(cu[1:], torch.arange(t), right=True)
        allowed = segment[:, None] == segment[None, :]
        q, k, v = (x.transpose(0, 1) for x in (query, key, value))  # [heads, t, dim]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return out.transpose(0, 1).reshape(t, -1)


@pytest.fixture(scope="module")
def imported_thd(imported, reference):
    """The tower on the THD route (the TE spec's segmented core attention over a CPU
    varlen reference; local linears, so the weights load by the same names)."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    from megatron_mm.models.norms import SequenceParallelNorm
    from megatron_mm.families.qwen2_5_vl.attention import SegmentedAttention
    from megatron_mm.families.qwen2_5_vl.vision import vision_layer_spec
    from megatron_mm.models.te_names import with_te_checkpoint_names

    core = type("SegmentedReference", (SegmentedAttention, ReferenceThdAttention), {})
    spec = with_te_checkpoint_names(vision_layer_spec(
        SequenceParallelNorm, ColumnParallelLinear, RowParallelLinear, core,
        frozenset(reference["config"].fullatt_block_indexes)))
    model = _build(reference["config"], layer_spec=spec)
    model.load_state_dict(imported.state_dict(), strict=True)
    assert model.vision_model.thd and not imported.vision_model.thd
    return model


def test_thd_route_equals_hugging_face(imported_thd, imported, reference):
    """Megatron-Core's layers carry the segments to the core attention (rotary angles per
    patch, unpacked), window layers get the windows and full layers the frames: the same
    tokens and gradients as Hugging Face and the local masks, and no device value read."""
    from host_syncs import HostSyncCounter

    batch = imported_thd.prepare(GRIDS)
    counter = HostSyncCounter()
    with counter.active():
        out = imported_thd(reference["pixels"], batch)
        (out * reference["weights"]).sum().backward()
    assert counter.found == []
    assert (out - reference["out"]).abs().max() <= TOLERANCE
    cores = [m.core_attention for m in imported_thd.modules() if hasattr(m, "core_attention")]
    layout = batch.layout
    assert [c.kinds for c in cores] == [[max(layout.window_seqlens)],
                                        [max(layout.frame_seqlens)]]  # fullatt: layer 1
    imported.zero_grad()
    local_out = imported(reference["pixels"], GRIDS)
    (local_out * reference["weights"]).sum().backward()
    grads = dict(imported.named_parameters())
    for name, p in imported_thd.named_parameters():  # gradients reach ~100 here
        scale = grads[name].grad.abs().max()
        assert (p.grad - grads[name].grad).abs().max() <= 1e-5 * scale, name
    imported.zero_grad()
    imported_thd.zero_grad()


def test_window_layers_differ_from_full_attention(imported, reference):
    """The window masks matter on these grids: attending the whole frame in every layer
    gives other tokens (so the parity test checks the windows)."""
    from megatron_mm.families.qwen2_5_vl.vision import WindowedDotProductAttention

    cores = [m for m in imported.modules() if isinstance(m, WindowedDotProductAttention)]
    assert [c.full_attention for c in cores] == [False, True]  # fullatt_block_indexes=[1]
    try:
        for c in cores:
            c.full_attention = True
        with torch.no_grad():
            all_full = imported(reference["pixels"], GRIDS)
    finally:
        cores[0].full_attention = False
    assert (all_full - reference["out"]).abs().max() > 1e-3


def test_activation_recompute_gives_the_same_step(gloo_world, reference):
    """--recompute-granularity full: the stacked masks go through Megatron-Core's
    checkpoint function; output and gradients unchanged."""
    from megatron_mm.families.qwen2_5_vl.vision import Qwen2_5VLVisionWithMerger
    from megatron_mm.families.qwen2_5_vl.config import Qwen2_5VLVisionConfig
    from megatron_mm.families.qwen2_5_vl.transformer_config import (
        qwen2_5_vl_merger_transformer_config,
        qwen2_5_vl_vision_transformer_config,
    )
    from megatron_mm.models.transformer_configs import BuildSettings

    enc = Qwen2_5VLVisionConfig.from_hf(reference["config"])
    s = BuildSettings(recompute_granularity="full", recompute_method="uniform",
                      recompute_num_layers=1)
    model = Qwen2_5VLVisionWithMerger(qwen2_5_vl_vision_transformer_config(enc, s),
                                      qwen2_5_vl_merger_transformer_config(enc, s), enc)
    plain = _imported(reference["state"], reference["config"])
    model.load_state_dict(plain.state_dict())
    grads = []
    for m in (plain, model):
        m.train()
        (m(reference["pixels"], GRIDS) * reference["weights"]).sum().backward()
        grads.append({k: p.grad for k, p in m.named_parameters()})
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


def test_import_export_round_trip_is_bit_identical(gloo_world, reference):
    from megatron_mm.hf.transforms import Context

    model = _imported(reference["state"], reference["config"])
    back = _table().to_hf(_megatron_names(model), Context(HEADS))
    assert set(back) == set(reference["state"])
    for name, tensor in reference["state"].items():
        assert back[name].shape == tensor.shape and torch.equal(back[name], tensor), name


def _tp_worker(rank, state, hf_config, pixels, weights, ckpt_dir):
    """TP=1 on both ranks (data-parallel replicas) saves the imported weights as a
    distributed checkpoint; TP=2 loads it (Megatron-Core reshards: QKV per group, fc1's
    gate/up halves per rank) and runs the same batch."""
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    torch.distributed.init_process_group("gloo")
    results = {}
    for tp in (1, 2):
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(tp, 1)
        model_parallel_cuda_manual_seed(1234)
        if tp == 1:
            model = _imported(state, hf_config)
            dist_checkpointing.save(model.sharded_state_dict(), ckpt_dir)
            torch.distributed.barrier()
        else:
            model = _build(hf_config)
            qkv = model.vision_model.decoder.layers[0].self_attention.linear_qkv.weight
            assert qkv.shape == (3 * 32 // 2, 32)  # really split: 2 of 4 heads per rank
            loaded = dist_checkpointing.load(model.sharded_state_dict(), ckpt_dir)
            model.load_state_dict(loaded, strict=True)
        out = model(pixels, GRIDS)
        (out * weights).sum().backward()
        # Replicated parameters have whole gradients on every TP rank.
        grads = {k: p.grad.clone() for k, p in model.named_parameters()
                 if not getattr(p, "tensor_model_parallel", False)}
        results[tp] = (out.detach(), grads)
    parallel_state.destroy_model_parallel()
    return results


@pytest.mark.processes
def test_tensor_parallel_equals_one_process(reference, tmp_path):
    from dist_harness import run_distributed

    results = run_distributed(_tp_worker, 2, reference["state"], reference["config"],
                              reference["pixels"], reference["weights"], str(tmp_path))
    for rank, res in enumerate(results):
        (out1, g1), (out2, g2) = res[1], res[2]
        diff = (out2 - out1).abs().max().item()
        hf_diff = (out2 - reference["out"]).abs().max().item()
        print(f"rank {rank}: TP=2 vs TP=1 max abs diff {diff:.3g}, vs HF {hf_diff:.3g}")
        assert diff <= TOLERANCE and hf_diff <= TOLERANCE
        assert set(g1) == set(g2) and "vision_model.patch_embed.weight" in g1
        for name in g1:
            assert torch.allclose(g2[name], g1[name], atol=1e-5, rtol=1e-4), name


def test_table_serves_the_full_model(gloo_world):
    """Under ``model.visual.`` the table imports the tower of a whole
    ``Qwen2_5_VLForConditionalGeneration`` (transformers 5.x in-memory names)."""
    from megatron_mm.hf.mapping import MappingTable
    from megatron_mm.families.qwen2_5_vl.hf_table import qwen2_5_vl_vision_rules
    from megatron_mm.hf.transforms import Context
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                 "mrope_section": [2, 3, 3]})
    torch.manual_seed(0)
    hf = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(text_config=text, vision_config=HF_VISION)).eval()
    state = hf.state_dict()
    model = _build(hf.config.vision_config)
    mapped, used = MappingTable(qwen2_5_vl_vision_rules("model.visual.")).to_megatron(
        state, _megatron_names(model), Context(HEADS))
    assert used == {k for k in state if k.startswith("model.visual.")}
    model.load_state_dict({**model.state_dict(), **mapped})
    pixels, _ = _inputs()
    with torch.no_grad():
        ref = hf.model.visual(pixels, torch.tensor(GRIDS)).pooler_output
        assert (model(pixels, GRIDS) - ref).abs().max() <= TOLERANCE


def test_layout_matches_hugging_face_helpers():
    """Window permutation, window boundaries, per-frame segments and 2-D positions equal
    transformers' ``vision_utils`` on grids with partial windows and videos."""
    from transformers.vision_utils import (
        get_vision_cu_seqlens,
        get_vision_position_ids,
        get_vision_window_index,
    )

    for grids, window in ((GRIDS, 56), ([(1, 6, 10), (3, 2, 2), (1, 12, 4)], 56),
                          ([(2, 10, 14)], 112)):
        layout = vision_grid_layout(grids, 2, window, 14)
        grid_t = torch.tensor(grids)
        index, cu_windows = get_vision_window_index(grid_t, 2, window, 14)
        assert torch.equal(layout.window_index, index)
        assert torch.equal(layout.cu_window_seqlens, cu_windows)
        assert torch.equal(layout.cu_frame_seqlens, get_vision_cu_seqlens(grid_t))
        positions = get_vision_position_ids(grid_t, 2)
        permuted = positions.reshape(-1, 4, 2)[index].reshape(-1, 2)
        assert torch.equal(layout.positions, permuted)
        assert torch.equal(index[layout.reverse_index], torch.arange(index.numel()))


def test_block_diagonal_mask():
    mask = block_diagonal_mask([2, 1, 3])[0, 0]
    allowed = ~mask
    assert allowed.sum() == 4 + 1 + 9
    assert allowed[0, 1] and not allowed[1, 2] and allowed[3, 5] and not allowed[5, 0]


def test_bad_input_is_a_clear_error(imported, reference):
    with pytest.raises(ValueError, match="host metadata"):
        vision_grid_layout(torch.tensor(GRIDS, device="meta"))
    with pytest.raises(ValueError, match="multiples of the spatial merge size"):
        vision_grid_layout([(1, 5, 4)])
    with pytest.raises(ValueError, match="pixel_values has shape"):
        imported(reference["pixels"][:-4], GRIDS)


def test_config_refuses_what_it_does_not_implement(reference):
    from megatron_mm.families.qwen2_5_vl.vision import qwen2_5_vl_vision_layer_spec
    from megatron_mm.families.qwen2_5_vl.config import Qwen2_5VLVisionConfig

    with pytest.raises(ConfigError, match="fullatt-block-indexes"):
        Qwen2_5VLVisionConfig(num_layers=2, fullatt_block_indexes=(2,))
    with pytest.raises(ConfigError, match="window-size"):
        Qwen2_5VLVisionConfig(window_size=14)
    cfg = reference["config"]
    bad = type(cfg)(**{**cfg.to_dict(), "hidden_act": "gelu"})
    with pytest.raises(ConfigError, match="hidden_act"):
        Qwen2_5VLVisionConfig.from_hf(bad)
    with pytest.raises(ConfigError, match="--transformer-impl must be local"):
        qwen2_5_vl_vision_layer_spec(Qwen2_5VLVisionConfig(), "flash")
