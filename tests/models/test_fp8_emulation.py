"""FP8 emulation against the formulas Transformer Engine's own tests check
(tests/pytorch/test_recipe.py, tests/pytorch/references/quantize_scale_calc.py,
ref_per_tensor_cs.py), on hand-checked values. Written here from those formulas."""

import pytest
import torch
import torch.nn.functional as F
from tiny_multimodal import tiny_model

from megatron_mm.models import fp8_state
from megatron_mm.models.fp8_emulation import (
    DelayedScalingMeta,
    current_scale,
    delayed_meta,
    emulate_linears,
    emulated_autocast,
    quantize_dequantize,
)
from megatron_mm.models.fp8_scaling import FP32_MAX, amax_update


# --- the cast -------------------------------------------------------------------------

def test_cast_hand_checked_e4m3_and_e5m2():
    x = torch.tensor([0.3, -2.0, 1.0, 0.0, 0.35])
    # amax 2: E4M3 scale 448 / 2 = 224. 0.3 * 224 = 67.2 lies between E4M3's 64 and 72
    # (3 mantissa bits: step 8 in [64, 128)) -> 64; 0.35 * 224 = 78.4 -> 80.
    s = current_scale(torch.tensor(2.0), "e4m3")
    assert s.item() == 224.0
    assert torch.equal(quantize_dequantize(x, s, "e4m3"),
                       torch.tensor([64 / 224, -2.0, 1.0, 0.0, 80 / 224]))
    # E5M2: scale 57344 / 2 = 28672. 0.3 * 28672 = 8601.6 between 8192 and 10240 (2
    # mantissa bits: step 2048 in [8192, 16384)) -> 8192; 0.35 -> 10035.2 -> 10240.
    s = current_scale(torch.tensor(2.0), "e5m2")
    assert s.item() == 28672.0
    assert torch.equal(quantize_dequantize(x, s, "e5m2"),
                       torch.tensor([8192 / 28672, -2.0, 1.0, 0.0, 10240 / 28672]))


def test_cast_saturates_like_te():
    # A stale delayed scale can push values past the format's range: TE's casts are
    # satfinite (E5M2 too, where torch's own cast gives inf).
    one = torch.tensor(1.0)
    big = torch.tensor([1000.0, -1e6])
    assert torch.equal(quantize_dequantize(big, one, "e4m3"), torch.tensor([448.0, -448.0]))
    assert torch.equal(quantize_dequantize(big, one, "e5m2"), torch.tensor([1024.0, -57344.0]))


@pytest.mark.parametrize("fmt, fp8_max", [("e4m3", 448.0), ("e5m2", 57344.0)])
def test_current_scale_edge_cases(fmt, fp8_max):
    # TE's scale_from_amax_tensor (eps 0, no power-of-2 scales): amax 0 -> scale 1; a
    # scale past FP32's range -> FP32's max; else fp8_max / amax.
    assert current_scale(torch.tensor(0.0), fmt).item() == 1.0
    tiny = torch.tensor(fp8_max / FP32_MAX / 2)
    assert current_scale(tiny, fmt).item() == FP32_MAX
    assert current_scale(torch.tensor(0.5), fmt).item() == fp8_max * 2


# --- delayed scaling: the update ------------------------------------------------------

@pytest.mark.parametrize("fmt, fp8_max", [("e4m3", 448.0), ("e5m2", 57344.0)])
@pytest.mark.parametrize("case", ["zero", "tiny", "normal", "inf", "nan"])
def test_delayed_update_numeric_scenarios(fmt, fp8_max, case):
    # TE test_scale_update_numeric_scenarios: history [[amax]], scale 1.
    amax = {"zero": 0.0, "tiny": fp8_max / FP32_MAX / 2, "normal": 0.625,
            "inf": float("inf"), "nan": float("nan")}[case]
    expected = {"zero": 1.0, "tiny": FP32_MAX, "normal": fp8_max / 0.625, "inf": 1.0,
                "nan": 1.0}[case]
    history, scale = torch.tensor([[amax]]), torch.ones(1)
    amax_update(history, scale, fp8_max, "most_recent", 0)
    assert scale.item() == pytest.approx(expected, rel=1e-7)


def test_delayed_update_rolls_history_hand_checked():
    # Two tensors, history length 3, newest amax in slot 0 (written since the last
    # update). Tensor 0: history [5, 1, 2] -> window (1, 2, 5); tensor 1: newest 0 ->
    # untouched (TE rolls only when there is a new amax).
    history = torch.tensor([[5.0, 0.0], [1.0, 7.0], [2.0, 3.0]])
    scale = torch.tensor([1.0, 0.5])
    amax_update(history, scale, 448.0, "max", 1)
    assert torch.equal(history, torch.tensor([[0.0, 0.0], [2.0, 7.0], [5.0, 3.0]]))
    assert torch.equal(scale, torch.tensor([448.0 / 5 / 2, 0.5]))
    # The next update sees 1.0 new: window (2, 5, 1): max 5, most_recent 1.
    history[0, 0] = 1.0
    h2, s2 = history.clone(), scale.clone()
    amax_update(history, scale, 448.0, "max", 1)
    assert torch.equal(history[:, 0], torch.tensor([0.0, 5.0, 1.0]))
    assert scale[0].item() == pytest.approx(448.0 / 5 / 2)
    amax_update(h2, s2, 448.0, "most_recent", 1)
    assert s2[0].item() == pytest.approx(448.0 / 1 / 2)


def test_delayed_max_skips_nan_like_tes_kernel():
    # delayed_scaling.cu takes the window's max with fmaxf, which ignores NaN.
    history, scale = torch.tensor([[2.0], [float("nan")]]), torch.ones(1)
    amax_update(history, scale, 448.0, "max", 0)
    assert scale.item() == 224.0


def test_meta_record_keeps_the_max_until_update():
    meta = DelayedScalingMeta(1, 2, "e4m3")
    meta.record(0, torch.tensor(3.0))
    meta.record(0, torch.tensor(2.0))
    assert meta.amax_history[0, 0].item() == 3.0


# --- delayed scaling in a linear layer (TE test_fp8_scale_update_with_linear_fuser_op) --

def _linear(gloo_world, fp8="hybrid", recipe="delayed", history=3, algo="max", margin=2,
            bias=False):
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=1,
                               fp8=fp8, fp8_recipe=recipe, fp8_amax_history_len=history,
                               fp8_amax_compute_algo=algo, fp8_margin=margin,
                               use_cpu_initialization=True, gradient_accumulation_fusion=False)
    linear = ColumnParallelLinear(16, 16, config=config, init_method=torch.nn.init.zeros_,
                                  bias=bias, gather_output=False)
    assert emulate_linears(linear) == 1
    fp8_state.reset_fp8_state()
    return linear


def test_delayed_scaling_state_lives_on_the_weights_device(gloo_world):
    """Made on the host and moved at the first cast, the amax history and scales cost a
    blocking host-to-device copy inside the first step on a GPU (an H100 run's host-sync
    check found it). Here the weight is on the meta device, and so is the state."""
    linear = _linear(gloo_world)
    meta = torch.nn.Parameter(torch.empty_like(linear.weight, device="meta"))
    linear.weight = meta
    emu = type(linear.fp8_emulation)(linear, "column")
    for state in (emu.fwd, emu.bwd):
        assert state.amax_history.device.type == "meta"
        assert state.scale.device.type == "meta"


def _run(linear, x, **kw):
    """One forward in the linear's FP8 autocast (Megatron-Core enters it around the block)."""
    with emulated_autocast(linear.config):
        return linear(x, **kw)[0]


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("history_len", [3, 8])
def test_delayed_scaling_steps_in_a_linear(gloo_world, algo, history_len, margin=2):
    linear = _linear(gloo_world, history=history_len, algo=algo, margin=margin)
    fwd, bwd = delayed_meta(linear), delayed_meta(linear, forward=False)
    amaxes = {"x": [], "w": [], "dy": []}
    scales = {"x": 1.0, "w": 1.0, "dy": 1.0}  # TE starts every scale at 1
    for step in range(5):
        for k, v in zip(("x", "w", "dy"), (step + 0.25, step + 0.5, step + 0.75)):
            amaxes[k].append(v)
        x = torch.full((4, 2, 16), amaxes["x"][-1], requires_grad=True)
        dy = torch.full((4, 2, 16), amaxes["dy"][-1])
        with torch.no_grad():
            linear.weight.fill_(amaxes["w"][-1])
        linear.weight.grad = None
        linear.is_first_microbatch = True  # a step's first micro-batch: the weight re-cast
        y = _run(linear, x)
        y.backward(dy)  # the first FP8 module of its autocast: reduces after its backward

        # The GEMMs used the scales from before this step: y = q(x) q(w)^T,
        # dgrad = q(dy) q(w), wgrad = q(dy)^T q(x), q(dy) in E5M2 (hybrid).
        qx = quantize_dequantize(x.detach(), torch.tensor(scales["x"]), "e4m3")
        qw = quantize_dequantize(linear.weight.detach(), torch.tensor(scales["w"]), "e4m3")
        qdy = quantize_dequantize(dy, torch.tensor(scales["dy"]), "e5m2")
        torch.testing.assert_close(y, F.linear(qx, qw), rtol=0, atol=0)
        torch.testing.assert_close(x.grad, qdy @ qw, rtol=0, atol=0)
        torch.testing.assert_close(linear.weight.grad,
                                   qdy.reshape(-1, 16).t() @ qx.reshape(-1, 16),
                                   rtol=1e-6, atol=0)

        # Then the history rolled and the scales updated (TE: max_fwd 448, max_bwd 57344).
        for k, meta, col, fp8_max in (("x", fwd, 0, 448.0), ("w", fwd, 1, 448.0),
                                      ("dy", bwd, 0, 57344.0)):
            seen = amaxes[k]
            kept = seen[-(history_len - 1):]
            want_history = [0.0] * (history_len - len(kept)) + kept
            want_history[0] = 0.0
            assert meta.amax_history[:, col].tolist() == want_history
            ref_amax = max(seen[-history_len:]) if algo == "max" else seen[-1]
            ref_scale = (fp8_max / ref_amax) / 2 ** margin
            assert meta.scale[col].item() == pytest.approx(ref_scale, rel=1e-6)
            scales[k] = meta.scale[col].item()


def test_e4m3_format_quantises_gradients_to_e4m3(gloo_world):
    linear = _linear(gloo_world, fp8="e4m3", history=1, algo="most_recent", margin=0)
    bwd = delayed_meta(linear, forward=False)
    assert bwd.fmt == "e4m3"
    x = torch.ones(8, 1, 16, requires_grad=True)
    y = _run(linear, x)
    y.backward(torch.full_like(y, 2.0))
    assert bwd.scale.item() == 448.0 / 2  # E4M3's max, not E5M2's


def test_no_grad_forward_records_without_update(gloo_world):
    # TE updates on leaving fp8_autocast only with gradients enabled; the amax written by an
    # evaluation forward stays in slot 0 and joins the next training update.
    linear = _linear(gloo_world, history=2, algo="most_recent", margin=0)
    fwd = delayed_meta(linear)
    with torch.no_grad():
        _run(linear, torch.full((8, 1, 16), 4.0))
    assert fwd.amax_history[0, 0].item() == 4.0 and fwd.scale[0].item() == 1.0
    _run(linear, torch.full((8, 1, 16), 1.0, requires_grad=True))
    assert fwd.scale[0].item() == 448.0 / 4.0


def test_tensorwise_scales_each_tensor_now(gloo_world):
    linear = _linear(gloo_world, recipe="tensorwise", bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.linspace(-3, 3, 256).view(16, 16))
        linear.bias.fill_(0.1)
    x = torch.linspace(-1, 0.5, 128).view(8, 1, 16).requires_grad_()
    y = _run(linear, x)
    qx = quantize_dequantize(x.detach(), current_scale(torch.tensor(1.0), "e4m3"), "e4m3")
    qw = quantize_dequantize(linear.weight.detach(), current_scale(torch.tensor(3.0), "e4m3"),
                             "e4m3")
    torch.testing.assert_close(y, F.linear(qx, qw) + 0.1, rtol=0, atol=0)
    dy = torch.linspace(-5, 5, 128).view(8, 1, 16)
    y.backward(dy)
    # The bias gradient comes from the unquantised output gradient (TE's fused bgrad).
    torch.testing.assert_close(linear.bias.grad, dy.sum((0, 1)))
    qdy = quantize_dequantize(dy, current_scale(torch.tensor(5.0), "e5m2"), "e5m2")
    torch.testing.assert_close(x.grad, qdy @ qw, rtol=0, atol=0)


def test_mxfp8_is_refused(gloo_world):
    with pytest.raises(ValueError, match="emulates the delayed and tensorwise recipes"):
        _linear(gloo_world, recipe="mxfp8")


# --- which layers of a model run FP8 --------------------------------------------------

def test_emulated_layers_follow_megatron_cores_fp8_context(gloo_world):
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    from megatron_mm.models.fp8_emulation import emulated_linears
    from megatron_mm.plan.fp8 import Fp8Settings

    fp8 = Fp8Settings("hybrid", recipe="tensorwise", first_last_layers_bf16=True,
                      num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=0,
                      modules=("llm", "vision-projector"), emulation=True)
    model = tiny_model(fp8, llm_layers=3)
    names = sorted(n for n, m in model.named_modules() if m in emulated_linears(model))
    # LLM layers 2 and 3 (layer 1 kept BF16), the projector; not the ViT (not listed), not
    # the output layer or embeddings (outside get_fp8_context, as with TE).
    assert names == sorted(
        [f"language_model.decoder.layers.{i}.{lin}" for i in (1, 2) for lin in (
            "self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1",
            "mlp.linear_fc2")] + ["vision_projection.encoder.linear_fc1",
                                  "vision_projection.encoder.linear_fc2"])
    assert isinstance(model.language_model.output_layer, ColumnParallelLinear)
    assert model.language_model.config.fp8 == "hybrid"
    assert model.vision_model.config.fp8 is None

    # Same weights without FP8: the quantisation changes the loss a little, not a lot.
    plain = tiny_model(None, llm_layers=3)
    plain.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 200, (2, 32))
    tokens[:, 2:18] = 250
    batch = dict(tokens=tokens, position_ids=torch.arange(32).expand(2, -1), labels=tokens,
                 media={"image": torch.randn(2, 3, 16, 16)})
    losses = [m(**batch).float().mean() for m in (model, plain)]
    assert losses[0].item() != losses[1].item()
    assert losses[0].item() == pytest.approx(losses[1].item(), rel=0.05)
    losses[0].backward()
    assert model.language_model.decoder.layers[1].mlp.linear_fc1.weight.grad is not None


def test_set_is_first_microbatch_reaches_every_module(gloo_world):
    # Megatron-Core refreshes TE's FP8 weight caches only when the top config (the LLM's)
    # is FP8; an FP8 encoder under a BF16 LLM must be refreshed too.
    model = tiny_model(None, llm_layers=3)
    fc1 = model.vision_projection.encoder.linear_fc1
    fc1.is_first_microbatch = False
    model.set_is_first_microbatch()
    assert fc1.is_first_microbatch is True


# --- the amax reduction group ---------------------------------------------------------

@pytest.mark.processes
def test_amax_reduced_over_megatron_cores_group():
    from dist_harness import run_distributed
    from fp8_workers import amax_groups

    r = run_distributed(amax_groups, 2)
    x_amax, w_amax = r[0]["x_amax"], r[0]["w_amax"]
    for rank in (0, 1):
        # TP=2, delayed: the weight shards' amaxes reduced to the whole weight's (input
        # replicated); the output gradient's shards (1s and 2s) to 2; a row-parallel
        # layer's input shards to the whole input's.
        assert r[rank]["column"] == [x_amax, w_amax]
        assert r[rank]["column_grad"] == [2.0]
        assert r[rank]["row"] == [x_amax, w_amax]
        assert r[rank]["tensorwise_local"]
        # TE's dims check on the local shard under SP (module/linear.py: before the gather)
        assert "dims=[4, 1, 32] (product of leading dims = 4" in r[rank]["sp_shard_error"]
        assert r[rank]["sp_rows"] == 16
        # DP=2: reduced over data-parallel ranks (inputs x and 2x) unless tp_only_amax_red.
        assert r[rank]["dp_input_tp_only=False"] == pytest.approx(2 * x_amax)
        assert r[rank]["dp_input_tp_only=True"] == pytest.approx((rank + 1) * x_amax)
    assert r[0]["w_shard_amax"] != r[1]["w_shard_amax"]  # the reduction had work to do


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_no_host_sync_in_the_emulation(gloo_world, recipe):
    # Scale updates stay on the device: no .item() / int(t) / bool(t) (each a
    # _local_scalar_dense call) in forward or backward.
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountScalarReads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                CountScalarReads.count += 1
            return func(*args, **(kwargs or {}))

    linear = _linear(gloo_world, recipe=recipe, bias=True)
    x = torch.randn(4, 2, 16, requires_grad=True)
    with CountScalarReads():
        for _ in range(2):
            _run(linear, x).sum().backward()
    assert CountScalarReads.count == 0


def test_bf16_model_casts_in_bf16(gloo_world):
    linear = _linear(gloo_world, recipe="tensorwise").to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.linspace(-1, 1, 256).view(16, 16))
    x = torch.linspace(-2, 2, 128, dtype=torch.bfloat16).view(8, 1, 16)
    y = _run(linear, x)
    assert y.dtype == torch.bfloat16
    qx = quantize_dequantize(x, current_scale(torch.tensor(2.0), "e4m3"), "e4m3")
    qw = quantize_dequantize(linear.weight.detach(), current_scale(torch.tensor(1.0), "e4m3"),
                             "e4m3")
    torch.testing.assert_close(y, F.linear(qx, qw))


# --- Transformer Engine's FP8 state (quantization.py, module/linear.py) -------------------

def test_outside_an_autocast_the_linear_runs_in_high_precision(gloo_world):
    linear = _linear(gloo_world)
    with torch.no_grad():
        linear.weight.copy_(torch.linspace(-1, 1, 256).view(16, 16))
    x = torch.linspace(-1, 1, 128).view(8, 1, 16)
    torch.testing.assert_close(linear(x)[0], F.linear(x, linear.weight), rtol=0, atol=0)
    assert delayed_meta(linear).amax_history.abs().sum() == 0  # nothing recorded


def test_fp8_weight_cached_until_is_first_microbatch(gloo_world):
    # TE's Linear: the weight is quantised (and its amax recorded) when is_first_microbatch
    # is True or None, else the cached FP8 weight is used; Megatron-Core's TE layers clear
    # the flag after each forward.
    linear = _linear(gloo_world, history=1, algo="most_recent", margin=0)
    emu = linear.fp8_emulation
    x = torch.linspace(-2, 2, 128).view(8, 1, 16)
    with torch.no_grad():
        linear.weight.fill_(0.3)
    first = _run(linear, x)  # is_first_microbatch starts True
    assert linear.is_first_microbatch is False and emu.weight_casts == 1
    cached = quantize_dequantize(torch.full((16, 16), 0.3), torch.tensor(1.0), "e4m3")
    with torch.no_grad():
        linear.weight.fill_(0.7)  # not what a micro-batch of the same step sees
    second = _run(linear, x.requires_grad_())
    assert emu.weight_casts == 1
    sx = torch.tensor(448.0 / 2.0)  # the input's scale after the first micro-batch
    torch.testing.assert_close(second, F.linear(quantize_dequantize(x.detach(), sx, "e4m3"),
                                                cached), rtol=0, atol=0)
    second.sum().backward()
    assert linear.weight.grad is not None  # the gradient reaches the weight all the same
    linear.is_first_microbatch = True  # set_is_first_microbatch: the next step's weight
    third = _run(linear, x.detach())
    assert emu.weight_casts == 2
    sw = 448.0 / torch.tensor(0.3)  # from the amax recorded at the first cast
    torch.testing.assert_close(third, F.linear(
        quantize_dequantize(x.detach(), sx, "e4m3"),
        quantize_dequantize(linear.weight.detach(), sw, "e4m3")), rtol=0, atol=0)
    assert not torch.equal(first, third)


def _two_linears(gloo_world):
    a, b = _linear(gloo_world), _linear(gloo_world)
    fp8_state.reset_fp8_state()
    return a, b


def _record_reductions(monkeypatch):
    seen = []
    monkeypatch.setattr(fp8_state, "reduce_max", lambda t, group: seen.append(t.numel()))
    return seen


def test_one_amax_reduction_per_outermost_exit_whatever_ran(gloo_world, monkeypatch):
    a, b = _two_linears(gloo_world)
    seen = _record_reductions(monkeypatch)
    x = torch.ones(8, 1, 16, requires_grad=True)
    with emulated_autocast(a.config):  # nested regions reduce only at the outermost exit
        y = _run(a, x) + _run(b, x)
        assert seen == []
    assert seen == [4]  # one buffer: [x, w] amaxes of a and b
    _run(a, x)  # b did not run: the whole buffer is reduced all the same
    assert seen == [4, 4]
    with torch.no_grad():
        _run(a, x)  # no reduction without gradients
    with emulated_autocast(a.config):
        pass  # an empty region with gradients reduces too
    assert seen == [4, 4, 4]
    # In backward, the first module of each region reduces after its own backward: a
    # and b, each first in its inner region (leaving one restores is_first_fp8_module).
    y.sum().backward()
    assert seen == [4, 4, 4, 2, 2]
    y = _run(a, x) + _run(b, x)  # one region each, outermost
    y.sum().backward()
    assert seen[-2:] == [2, 2]


def test_a_module_joins_the_buffer_on_its_first_fp8_forward(gloo_world, monkeypatch):
    a, b = _two_linears(gloo_world)
    seen = _record_reductions(monkeypatch)
    x = torch.ones(8, 1, 16, requires_grad=True)
    _run(a, x)
    _run(b, x)
    # A rank whose micro-batch skipped b would have reduced 2 amaxes where its peers
    # reduced 4: on NCCL, a hang (MultimodalModel runs b on zeros instead).
    assert seen == [2, 4]


def test_frozen_module_updates_its_scales_when_training(gloo_world):
    from megatron_mm.models.fp8_context import fp8_region

    linear = _linear(gloo_world, history=1, algo="most_recent", margin=0)
    linear.weight.requires_grad_(False)
    linear.config.fp8_emulation = True
    fwd = delayed_meta(linear)
    for training in (False, True):
        with torch.no_grad(), fp8_region(linear.config, training):  # as a frozen encoder
            linear(torch.full((8, 1, 16), 4.0))
        # TE reduces and updates only on leaving the region with gradients enabled
        assert fwd.scale[0].item() == (448.0 / 4.0 if training else 1.0)


def test_the_weight_shard_is_checked_like_te(gloo_world):
    """TE checks each rank's weight as it holds it ([out / TP, in]): 12 rows are not a
    multiple of 8, though the 16-wide input passes."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=1,
                               fp8="hybrid", fp8_recipe="tensorwise",
                               use_cpu_initialization=True, gradient_accumulation_fusion=False)
    linear = ColumnParallelLinear(16, 12, config=config, init_method=torch.nn.init.zeros_,
                                  bias=False, gather_output=False)
    assert emulate_linears(linear) == 1
    fp8_state.reset_fp8_state()
    with pytest.raises(ValueError, match=r"dims=\[12, 16\] \(product of leading dims = 12"):
        _run(linear, torch.randn(8, 1, 16))
