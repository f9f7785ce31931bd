"""One reproduction per upstream bug of ``patches/`` (README.md): each function raises
AssertionError (or the upstream error) while its bug is there and returns once the patch
is applied. They import Megatron-Core alone, never megatron_mm (so none of its runtime
patches): run them with the tree to check first on ``sys.path``.

    python patches/reproductions.py [NAME ...]    # all by default; exit 1 if any fails

What a GPU has and this CPU lacks is stood in for inside the function, marked, and is no
part of the bug.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback

import torch


def _fresh_ranks():
    """Ranks forked from one server started as a fresh interpreter (a fork of this process
    would inherit the earlier reproductions' model-parallel groups and stand-ins), which
    imported this file and Megatron-Core once for every such rank (where Megatron-Core does
    not import, each rank's own import fails as before)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "megatron.core"])
    return ctx


def _one_rank_world():
    """A gloo world of one process (Megatron-Core's groups need one)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        store = dist.FileStore(tempfile.mktemp(prefix="repro-store-"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


def moe_paged_stash_import():
    """0001: ``import megatron.core`` (schedules -> moe.paged_stash -> triton kernels)."""
    import importlib.util

    if importlib.util.find_spec("triton") is not None:  # the bug needs triton absent
        sys.modules["triton"] = None  # import triton now raises ImportError
    import megatron.core.pipeline_parallel.schedules  # noqa: F401


def destroy_resets_embedding_ranks():
    """0002: after destroy_model_parallel() no rank is in an embedding group."""
    from megatron.core import parallel_state

    _one_rank_world()
    parallel_state.initialize_model_parallel()
    assert parallel_state.is_rank_in_embedding_group()
    parallel_state.destroy_model_parallel()
    assert parallel_state._POSITION_EMBEDDING_GLOBAL_RANKS is None  # reset upstream
    assert parallel_state._EMBEDDING_GLOBAL_RANKS is None, (
        "destroy_model_parallel left _EMBEDDING_GLOBAL_RANKS = "
        f"{parallel_state._EMBEDDING_GLOBAL_RANKS}")
    assert not parallel_state.is_rank_in_embedding_group()


def clip_vit_norm_without_te():
    """0003: CLIPViTModel with its default norms and a local layer spec, no TE."""
    from megatron.core import parallel_state
    from megatron.core.models.vision.clip_vit_model import CLIPViTModel
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    _one_rank_world()
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel()
    config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=2,
                               use_cpu_initialization=True)  # CPU stand-in
    cuda = torch.Tensor.cuda
    if not torch.cuda.is_available():  # CPU stand-in: its position ids' .cuda()
        torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        vit = CLIPViTModel(config, get_vit_layer_with_local_spec(), patch_dim=4, img_h=8,
                           img_w=8)
    finally:
        torch.Tensor.cuda = cuda
    assert vit.ln_pre is not None


def _distopt(params):
    """A DistributedOptimizer around torch AdamW over ``params``, holding only what the
    methods under test read (its constructor needs CUDA buffers: a CPU stand-in)."""
    from types import SimpleNamespace

    from megatron.core.optimizer import distrib_optimizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    assert not distrib_optimizer.HAVE_APEX_OR_TE, "the bug is torch's own Adam's"
    opt = DistributedOptimizer.__new__(DistributedOptimizer)
    opt.optimizer = torch.optim.AdamW(params, lr=0.1)
    opt.config = SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=False,
                                 fp16=False)
    opt.ddp_config = SimpleNamespace(use_megatron_fsdp=False)
    opt.grad_scaler = None
    opt.model_param_group_index_map = {}
    return opt


def distopt_load_with_torch_adam():
    """0004: state_dict() before the first step; the main param and Adam moments loaded
    into a stepped optimizer; each param's step advancing once per optimizer step."""
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    # (d) a fresh optimizer (loading a checkpoint) asks its own state_dict first
    fresh = _distopt(params).state_dict()
    assert fresh["optimizer"]["param_groups"][0]["step"] == 0
    opt = _distopt(params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.optimizer.step()
    # (a, b) a checkpoint's tensors into the main param and its moments
    model_param = torch.nn.Parameter(torch.zeros(3))
    opt.model_param_group_index_map = {model_param: (0, 0)}
    loaded = {"param": torch.full((3,), 7.0), "exp_avg": torch.full((3,), 0.5),
              "exp_avg_sq": torch.full((3,), 0.25)}
    opt._set_main_param_and_optimizer_states(model_param, loaded)
    assert torch.equal(params[0].detach(), loaded["param"])
    assert torch.equal(opt.optimizer.state[params[0]]["exp_avg"], loaded["exp_avg"])
    # (c) resume at step 3: one more step is step 4 for every param
    saved = opt.state_dict()
    for group in saved["optimizer"]["param_groups"]:
        group["step"] = 3
    opt.load_state_dict(saved)
    opt.optimizer.step()
    steps = [float(opt.optimizer.state[p]["step"]) for p in params]
    assert steps == [4.0, 4.0], f"after one step from step 3 the params are at {steps}"


def _moe_counts(rank, store_path, out_path):
    import torch.distributed as dist

    from megatron.core.transformer.moe.moe_utils import get_tokens_per_expert_and_token_count

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank,
                            world_size=2)
    # 4 experts, top-1; rank 0 holds 3 valid tokens, rank 1 one (the rest padding: routed
    # nowhere)
    routing = torch.zeros(4, 4, dtype=torch.bool)
    for t in range(3 if rank == 0 else 1):
        routing[t, t] = True
    _, local, total = get_tokens_per_expert_and_token_count(
        routing, dist.group.WORLD, topk=1, with_padding_mask=True)
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump([float(local), float(total)], f)
    dist.destroy_process_group()


def moe_local_token_count():
    """0005: with a padding mask the local token count is the rank's own (2 ranks)."""
    import multiprocessing

    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "counts")
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=_moe_counts, args=(r, store, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        got = [json.load(open(f"{out}.{r}")) for r in range(2)]
    assert got == [[3.0, 4.0], [1.0, 4.0]], f"(local, total) tokens per rank: {got}"


def recompute_non_tensor_arguments():
    """0006: tensor_parallel.checkpoint of a function taking a non-tensor argument, whose
    gradient equals the function's without recompute."""
    from megatron.core.tensor_parallel import random

    # CPU stand-in: the CUDA RNG states the checkpoint saves and restores
    random._get_all_rng_states = lambda: (torch.get_rng_state(), None, {})
    random._set_all_rng_states = lambda cpu, cuda, tracker: torch.set_rng_state(cpu)

    class Mask:  # an attention-mask object, not a tensor
        scale = 3.0

    def f(x, mask):
        return (x * mask.scale).sin()

    x = torch.linspace(0, 1, 5, requires_grad=True)
    random.checkpoint(f, False, x, Mask()).sum().backward()
    expected = torch.autograd.grad(f(x, Mask()).sum(), x)[0]
    assert torch.allclose(x.grad, expected)


def _gdn_out_norm_grads(rank, store_path, out_path):
    import importlib

    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.ssm.gated_delta_net import common
    from megatron.core.ssm.gated_delta_net.gdn import GatedDeltaNet
    from megatron.core.ssm.gated_delta_net.common import GatedDeltaNetSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import TransformerConfig

    fmg = importlib.import_module("megatron.core.distributed.finalize_model_grads")
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank,
                            world_size=2)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    # CPU stand-ins: FLA's presence (deterministic mode runs torch's rule and conv1d, not
    # FLA's kernels), the conv1d's CUDA device, eager instead of torch.compile
    common.HAVE_FLA = True
    torch.cuda.current_device = lambda: "cpu"
    torch._dynamo.config.disable = True
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                               normalization="RMSNorm", deterministic_mode=True,
                               use_cpu_initialization=True, perform_initialization=False,
                               tensor_model_parallel_size=2, linear_conv_kernel_dim=4,
                               linear_key_head_dim=8, linear_value_head_dim=8,
                               linear_num_key_heads=2, linear_num_value_heads=2)
    submodules = GatedDeltaNetSubmodules(in_proj=ColumnParallelLinear,
                                         out_norm=WrappedTorchNorm, out_proj=RowParallelLinear)
    gdn = GatedDeltaNet(config, submodules, layer_number=1, use_qk_l2norm=False,
                        pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    torch.manual_seed(rank)  # each TP rank its own heads' weights
    with torch.no_grad():
        for param in gdn.parameters():
            param.uniform_(0.5, 1.0)
    torch.manual_seed(0)  # the same input on both ranks
    out, _ = gdn(torch.randn(6, 1, 16), attention_mask=None)
    out.square().sum().backward()
    for param in gdn.parameters():
        param.main_grad = param.grad
    partial = gdn.out_norm.weight.grad.clone()
    partials = [torch.empty_like(partial) for _ in range(2)]
    dist.all_gather(partials, partial)

    class Chunk(torch.nn.Module):  # the DDP-wrapped model chunk finalize_model_grads reads
        ddp_config = type("DDPConfig", (), {"use_megatron_fsdp": False})()

    chunk = Chunk()
    chunk.gdn = gdn
    fmg._allreduce_non_tensor_model_parallel_grads([chunk], config)
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump({"partials": [p.tolist() for p in partials],
                   "finalized": gdn.out_norm.weight.main_grad.tolist()}, f)
    dist.destroy_process_group()


def gdn_out_norm_tp_grads():
    """0007: at TP=2 without sequence parallelism, the GDN output norm's weight (one for
    every value head; TP splits the heads) ends finalize_model_grads with the sum of both
    ranks' gradients, the same on both (2 ranks)."""
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "grads")
        procs = [_fresh_ranks().Process(target=_gdn_out_norm_grads, args=(r, store, out))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        got = [json.load(open(f"{out}.{r}")) for r in range(2)]
    total = torch.tensor(got[0]["partials"]).sum(0)
    assert not torch.allclose(*map(torch.tensor, got[0]["partials"])), "ranks' shares equal"
    for rank in range(2):
        finalized = torch.tensor(got[rank]["finalized"])
        assert torch.allclose(finalized, total), (
            f"rank {rank}'s out_norm gradient after finalize_model_grads {finalized.tolist()}"
            f", the sum over TP {total.tolist()}")


def argument_help_percent():
    """0008: the help of Megatron-LM's flags built from TransformerConfig's docstrings
    (``--help`` of every Megatron-LM script): one says "10%"."""
    import argparse
    import typing

    if not hasattr(typing, "override"):  # Python 3.11 (the wheel declares 3.12): not the bug
        typing.override = lambda f: f
    from megatron.training.arguments import add_megatron_arguments

    help_text = add_megatron_arguments(argparse.ArgumentParser()).format_help()
    assert "(e.g. 1.10 = 10%)" in help_text



def defer_wgrad_local_linears():
    """0009: under --defer-embedding-wgrad-compute a local ColumnParallelLinear other than
    the output layer (no deferral buffers: a QKV or MLP projection) runs forward and
    backward and computes its own weight gradient; the output layer still defers."""
    from types import SimpleNamespace

    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, layers

    _one_rank_world()
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel()
    # CPU stand-in: Apex's fused weight-gradient kernel (main_grad += grad_output^T input),
    # which the flag requires
    layers._grad_accum_fusion_available = True
    layers.fused_weight_gradient_mlp_cuda = SimpleNamespace(
        wgrad_gemm_accum_fp32=lambda x, dy, main_grad: main_grad.add_(dy.t().matmul(x)))
    config = ModelParallelConfig(pipeline_model_parallel_size=2,  # the flag needs PP > 1
                                 pipeline_dtype=torch.float32,
                                 gradient_accumulation_fusion=True,
                                 defer_embedding_wgrad_compute=True,
                                 use_cpu_initialization=True)  # CPU stand-in

    def linear(**buffers):
        module = ColumnParallelLinear(8, 4, config=config, init_method=torch.nn.init.ones_,
                                      bias=False, **buffers)
        module.weight.main_grad = torch.zeros_like(module.weight)  # as DDP gives it
        return module

    qkv = linear()
    inputs, grads = [], []
    output_layer = linear(embedding_activation_buffer=inputs, grad_output_buffer=grads)
    out, _ = qkv(torch.ones(3, 1, 8))
    logits, _ = output_layer(out.repeat(1, 1, 2))
    logits.sum().backward()
    assert torch.equal(qkv.weight.main_grad, torch.full((4, 8), 24.0)), qkv.weight.main_grad
    assert len(inputs) == len(grads) == 1  # the output layer's, for the pipeline flush
    assert not output_layer.weight.main_grad.any()


def _broadcast(rank, store_path, out_path):
    from datetime import timedelta

    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import data as tp_data

    # the peer's failure ends the collective (gloo's default timeout is 30 minutes)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    parallel_state.initialize_model_parallel()  # the default TP groups: one rank each

    # CPU stand-ins: data.py's device="cuda" tensors, .cuda() and current_device()
    class CpuTorch:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def tensor(*args, device=None, **kwargs):
            return torch.tensor(*args, **kwargs)

    tp_data.torch = CpuTorch()
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.cuda.current_device = lambda: "cpu"
    # a group of both ranks (e.g. a ProcessGroupCollection's TP group); only its first
    # rank holds the batch, as in Megatron-LM's get_batch
    group = dist.new_group([0, 1])
    batch = {"tokens": torch.arange(6).view(2, 3)} if rank == 0 else None
    got = tp_data.broadcast_data(["tokens"], batch, torch.int64, tp_group=group)
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(got["tokens"].tolist(), f)
    dist.destroy_process_group()


def broadcast_data_tp_group():
    """0010: broadcast_data over a given TP group of 2 ranks, the default TP groups one
    rank each: the second rank receives the first's batch (2 ranks)."""
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "batch")
        procs = [_fresh_ranks().Process(target=_broadcast, args=(r, store, out))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        got = [json.load(open(f"{out}.{r}")) for r in range(2)]
    assert got == [[[0, 1, 2], [3, 4, 5]]] * 2, f"the batch per rank: {got}"


REPRODUCTIONS = {fn.__name__: fn for fn in (
    moe_paged_stash_import, destroy_resets_embedding_ranks, clip_vit_norm_without_te,
    distopt_load_with_torch_adam, moe_local_token_count, recompute_non_tensor_arguments,
    gdn_out_norm_tp_grads, argument_help_percent, defer_wgrad_local_linears,
    broadcast_data_tp_group)}


def main(names) -> int:
    results = {}
    for name in names or REPRODUCTIONS:
        try:
            REPRODUCTIONS[name]()
            results[name] = "ok"
        except Exception as e:  # the bug: its error, on one line
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            results[name] = f"FAILED: {last}"
        finally:  # each starts without a world (moe_local_token_count forks its ranks)
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
    assert "megatron_mm" not in sys.modules  # no runtime patch
    core = sys.modules.get("megatron.core")
    print(json.dumps({"megatron": core and os.path.dirname(os.path.dirname(core.__file__)),
                      "results": results}))
    return int(any(r != "ok" for r in results.values()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
