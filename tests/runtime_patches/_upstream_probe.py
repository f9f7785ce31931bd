"""Run megatron-core code paths with the CPU patches withheld, in a fresh process.

Started once per test session by ``conftest.py`` (fixture ``upstream``) as
``python _upstream_probe.py``; prints one line ``PROBE-RESULTS <json>`` mapping each probe
name to what it raised (exception type, message, traceback lines) or returned. The tests
of each patch assert from it that the upstream failure the patch fixes really happens on
this machine, at the documented call site.

Patches are applied in stages, each stage adding only what is needed to reach the next
call site (a patch cannot be taken back within a process):

0. nothing         ``import megatron.core``                        -> triton_stub
1. triton_stub     every direct CUDA call on our paths              -> the other patches
2. + current_device, clip_vit_norm, rng, causal_mask: CLIPViTModel reaches
   ``position_ids.cuda()``; DDP reaches ``torch.cuda.current_stream()``
3. all but tensor_type_str and distopt_load: building a DistributedOptimizer
4. all but distopt_load: DistributedOptimizer checkpoint load into a fresh optimizer

Top-level imports stay stdlib only: dist_checkpointing's save starts a ``spawn`` manager,
which re-imports this file as ``__mp_main__``.
"""

import importlib
import json
import os
import socket
import sys
import tempfile
import traceback

RESULTS = {}


def record(name, fn):
    try:
        value = fn()
    except BaseException as exc:  # noqa: BLE001 - recording is the point
        RESULTS[name] = {
            "error": type(exc).__name__,
            "message": str(exc),
            "frames": [
                f"{os.path.basename(f.filename)}:{f.lineno}: {(f.line or '').strip()}"
                for f in traceback.extract_tb(exc.__traceback__)
            ],
        }
    else:
        RESULTS[name] = {"value": value}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    # ---- stage 0: nothing patched -------------------------------------------------------
    record("import_megatron_core", lambda: bool(importlib.import_module("megatron.core")))

    from megatron_mm.runtime_patches import PATCHES, apply_cpu_patches

    apply_cpu_patches(["triton_stub"])
    import torch

    import megatron.core  # noqa: F401
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel as DDP
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    ps.initialize_model_parallel(1, 1)
    cfg = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                            use_cpu_initialization=True, pipeline_dtype=torch.float32)

    class Tiny(MegatronModule):
        def __init__(self, seed=0):
            super().__init__(cfg)
            torch.manual_seed(seed)
            self.l1 = torch.nn.Linear(4, 8)
            self.l2 = torch.nn.Linear(8, 1)

        def forward(self, x):
            return self.l2(torch.tanh(self.l1(x)))

        def set_input_tensor(self, tensor):
            pass

    # ---- stage 1: only triton_stub ------------------------------------------------------
    from megatron.core.tensor_parallel import random as mrandom

    record("rng_seed", lambda: mrandom.model_parallel_cuda_manual_seed(1234))
    record("rng_fork", lambda: mrandom.get_cuda_rng_tracker().fork().__enter__())
    x = torch.randn(3, requires_grad=True)
    record("rng_checkpoint", lambda: tensor_parallel.checkpoint(lambda a: a * 2, False, x))

    from megatron.core.transformer import utils as tutils

    record("causal_mask", lambda: tutils.get_default_causal_mask(4))
    record("sliding_window_mask", lambda: tutils.get_sliding_window_causal_mask(4, 4, (2, 0)))

    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    record("rope", lambda: RotaryEmbedding(kv_channels=8, rotary_percent=1.0)(5).shape)
    record("rope_cp", lambda: rope_utils.get_pos_emb_on_this_cp_rank(
        torch.zeros(4, 1, 1, 8), 0, ps.get_context_parallel_group()).shape)

    record("tensor_cuda", lambda: torch.zeros(1).cuda())
    record("synchronize", lambda: torch.cuda.synchronize())
    record("current_stream", lambda: torch.cuda.current_stream())
    record("current_device", lambda: torch.cuda.current_device())

    from megatron.core import utils as mutils
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    record("l2_norm", lambda: mutils.local_multi_tensor_l2_norm(
        2048, None, [[torch.ones(3)]], False))
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    record("clip_grad_type", lambda: clip_grad_by_total_norm_fp32([param], 1.0, 5.0))
    record("tensor_type", lambda: torch.zeros(1).type())

    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.enums import ModelType

    def run_schedule():
        model = Tiny()
        model.model_type = ModelType.encoder_or_decoder
        data = iter([torch.randn(2, 4) for _ in range(2)])

        def step(it, m):
            return m(next(it)), lambda out: (out.pow(2).sum(), {})

        return get_forward_backward_func()(
            forward_step_func=step, data_iterator=data, model=[model], num_microbatches=2,
            seq_length=1, micro_batch_size=2)

    record("schedule_no_pipelining", run_schedule)

    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    comm = P2PCommunicator(pp_group=ps.get_pipeline_model_parallel_group(), config=cfg)
    record("p2p_sync", lambda: comm._communicate(
        tensor_send_next=None, tensor_send_prev=None, recv_prev=False, recv_next=False,
        tensor_shape=(2, 3)))
    record("p2p_recv_buffer", lambda: comm._communicate(
        tensor_send_next=torch.ones(2, 3), tensor_send_prev=None, recv_prev=True,
        recv_next=False, tensor_shape=(2, 3)))

    def ddp_grad_sync():
        ddp = DDP(cfg, DistributedDataParallelConfig(), Tiny())
        ddp(torch.randn(5, 4)).sum().backward()
        ddp.start_grad_sync()
        ddp.finish_grad_sync()

    record("ddp_build", ddp_grad_sync)

    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    def dist_save():
        with tempfile.TemporaryDirectory() as tmp:
            dist_checkpointing.save(
                {"w": ShardedTensor.from_rank_offsets("w", torch.ones(4), replica_id=0)}, tmp)

    record("dist_checkpoint_save", dist_save)

    from megatron.core.models.vision.clip_vit_model import CLIPViTModel
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec

    record("clip_vit_build", lambda: CLIPViTModel(cfg, get_vit_layer_with_local_spec()) and 1)

    def destroy():
        before = ps._EMBEDDING_GLOBAL_RANKS
        ps.destroy_model_parallel()
        return {"before": before, "after": ps._EMBEDDING_GLOBAL_RANKS,
                "in_embedding_group_after": ps.is_rank_in_embedding_group()}

    record("destroy_model_parallel", destroy)
    ps.initialize_model_parallel(1, 1)

    # ---- stage 2 ------------------------------------------------------------------------
    apply_cpu_patches(["current_device", "clip_vit_norm", "rng", "causal_mask"])
    mrandom.model_parallel_cuda_manual_seed(1234)
    record("clip_vit_build_with_norm",
           lambda: CLIPViTModel(cfg, get_vit_layer_with_local_spec()) and 1)
    record("ddp_grad_sync", ddp_grad_sync)

    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    moe_cfg = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                                num_moe_experts=2, moe_ffn_hidden_size=8,
                                moe_token_dispatcher_type="alltoall", add_bias_linear=False,
                                use_cpu_initialization=True, pipeline_dtype=torch.float32)
    from megatron.core.process_groups_config import ProcessGroupCollection

    record("moe_dispatcher", lambda: MoEAlltoAllTokenDispatcher(
        2, [0, 1], moe_cfg, ProcessGroupCollection.use_mpu_process_groups()) and 1)
    record("moe_split_sizes", lambda: type(moe_utils.maybe_move_tensor_to_cpu(
        torch.tensor([1, 2]), as_numpy=True)).__name__)
    record("all_to_all_tensor_splits", lambda: torch.distributed.all_to_all_single(
        torch.zeros(2), torch.zeros(2), output_split_sizes=torch.tensor([2]),
        input_split_sizes=torch.tensor([2])))
    # full recompute with an attention mask that is not a tensor (context parallelism's)
    record("checkpoint_object_arg", lambda: tensor_parallel.checkpoint(
        lambda x, mask: x * 2, False, torch.ones(2, requires_grad=True), object()).sum().item())
    # --defer-embedding-wgrad-compute: a local column-parallel linear that is not the
    # output layer (no deferral buffers)
    from megatron.core.model_parallel_config import ModelParallelConfig

    defer_cfg = ModelParallelConfig(pipeline_model_parallel_size=2, pipeline_dtype=torch.float32,
                                    gradient_accumulation_fusion=True,
                                    defer_embedding_wgrad_compute=True,
                                    use_cpu_initialization=True)
    defer_cfg.gradient_accumulation_fusion = False  # Apex's kernel; the forward fails first
    record("defer_wgrad_local_linear", lambda: tensor_parallel.ColumnParallelLinear(
        4, 4, config=defer_cfg, init_method=torch.nn.init.ones_, bias=False)(
            torch.ones(2, 1, 4))[0].shape)

    # ---- stage 3 ------------------------------------------------------------------------
    apply_cpu_patches([p.name for p in PATCHES if p.name not in ("tensor_type_str",
                                                                  "distopt_load")])
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    def build(seed=0):
        model = Tiny(seed)
        ddp = DDP(cfg, DistributedDataParallelConfig(use_distributed_optimizer=True), model)
        opt = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=True), [ddp])
        return model, ddp, opt

    record("distopt_build", lambda: build() and 1)

    # ---- stage 4 ------------------------------------------------------------------------
    apply_cpu_patches([p.name for p in PATCHES if p.name != "distopt_load"])
    data = torch.randn(5, 4)

    def train(ddp, opt):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        ddp(data).pow(2).mean().backward()
        ddp.finish_grad_sync()
        opt.step()

    def steps(opt):
        inner = opt.chained_optimizers[0].optimizer
        return [float(s["step"]) for s in inner.state.values()]

    model, ddp, opt = build()
    train(ddp, opt)
    train(ddp, opt)
    metadata = lambda kind: {"distrib_optim_sharding_type": kind}  # noqa: E731

    def fresh_sharded_state_dict():
        fresh_model, _, fresh_opt = build(1)
        fresh_opt.sharded_state_dict(fresh_model.sharded_state_dict(), is_loading=True,
                                     metadata=metadata("fully_reshardable"))

    record("distopt_fresh_sharded_state_dict", fresh_sharded_state_dict)

    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("fully_reshardable", "dp_reshardable"):
            path = os.path.join(tmp, kind)
            os.makedirs(path)
            msd = model.sharded_state_dict()
            dist_checkpointing.save(
                {"model": msd,
                 "optimizer": opt.sharded_state_dict(msd, metadata=metadata(kind))}, path)

            def load(kind=kind, path=path):
                new_model, new_ddp, new_opt = build(1)
                train(new_ddp, new_opt)  # upstream cannot load into a fresh optimizer at all
                new_msd = new_model.sharded_state_dict()
                state = dist_checkpointing.load(
                    {"model": new_msd,
                     "optimizer": new_opt.sharded_state_dict(new_msd, is_loading=True,
                                                             metadata=metadata(kind))}, path)
                new_model.load_state_dict(state["model"])
                new_opt.load_state_dict(state["optimizer"])

            record(f"distopt_load_{kind}", load)

    def shared_step():
        opt.load_state_dict(opt.state_dict())
        inner = opt.chained_optimizers[0].optimizer
        distinct = len({id(s["step"]) for s in inner.state.values()})
        before = steps(opt)
        train(ddp, opt)
        return {"distinct_step_tensors": distinct, "params": len(inner.state),
                "before": before, "after": steps(opt)}

    record("distopt_shared_step", shared_step)

    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.write("\nPROBE-RESULTS " + json.dumps(RESULTS, default=repr) + "\n")
    sys.stdout.flush()
