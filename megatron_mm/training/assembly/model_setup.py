"""The run's model and optimizer: this rank's model chunks as the plan places them, wrapped
for DDP (and BF16), Megatron-Core's optimizer and LR scheduler, and the hooks Megatron-LM's
loop installs on the model config."""

from __future__ import annotations

import dataclasses
from typing import List

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from ...families import modalities_of
from ...models import MultimodalModel, build_model
from ...models.wrappers import DistributedDataParallel, Float16Module
from .build_settings import build_settings
from .module_lr import config_overrides
from ..config.module_lr_args import module_rates
from .separate_world import on_encoder_rank, world_ranks


def build_model_chunks(config, tokenizer, model_config, plan, replicas=None
                       ) -> List[MultimodalModel]:
    """This rank's pipeline chunks (``config``: the RunConfig): one, or one per virtual
    stage (interleaved 1F1B), each holding the modules ``plan`` (a TrainingPlan) gives it;
    an encoder rank of ``--encoder-schedule separate`` its one encoder chunk."""
    media_ids = {m: tokenizer.media_token_id(m)
                 for enc in model_config.encoders.values() for m in modalities_of(enc)}
    if plan.separate is not None and on_encoder_rank(config):  # its encoders, whole
        place = plan.separate.encoder_chunk(
            world_ranks(config).own_encoder(torch.distributed.get_rank()))
        # on the encoder ranks' own grid: TP = --encoder-tensor-model-parallel-size, no
        # CP; no sequence parallelism, so the output is whole on each of them (sent once)
        settings = dataclasses.replace(
            build_settings(config, [place]), pipeline_model_parallel_size=1,
            virtual_pipeline_model_parallel_size=None,
            tensor_model_parallel_size=config.encoder_schedule.encoder_tensor_model_parallel_size
            or 1, context_parallel_size=1, sequence_parallel=False,
            recompute_num_layers=plan.recompute_num_layers[0])
        chunk = build_model(model_config, settings, media_ids, placement=place)
        if torch.cuda.is_available():
            chunk.cuda(torch.cuda.current_device())
        return [chunk]
    settings = build_settings(config, plan.placements, replicas)
    pp = config.parallel.pipeline_model_parallel_size
    rank = parallel_state.get_pipeline_model_parallel_rank()
    vpp = config.parallel.virtual_pipeline_model_parallel_size
    chunks = []
    for vp in range(vpp) if vpp else [None]:
        index = (vp or 0) * pp + rank
        chunk_settings = dataclasses.replace(
            settings, recompute_num_layers=plan.recompute_num_layers[index])
        chunks.append(build_model(model_config, chunk_settings, media_ids,
                                  placement=plan.placements[index], vp_stage=vp))
        if torch.cuda.is_available():  # as Megatron-LM's get_model: host-built modules too
            chunks[-1].cuda(torch.cuda.current_device())
    if replicas is not None:  # equal encoder replicas, each shard counted once in norms
        pieces = [p for chunk in chunks for p in chunk.encoder_piece_parameters()]
        replicas.sync_params(pieces)
        replicas.mark_duplicates(pieces)
    return chunks


def ddp_config(config) -> DistributedDataParallelConfig:
    """Megatron-LM's DDP settings for the run; ``--fp8-param-gather`` makes the distributed
    optimizer all-gather the FP8 parameters and requantise them after each step."""
    # --overlap-param-gather: each bucket's all-gather finishes in the forward pre-hook of
    # the first module using it (the next bucket's dispatched there), each chunk's first
    # bucket at its first use (no param_sync_func: align_param_gather off)
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=config.parallel.overlap_grad_reduce,
        overlap_param_gather=config.parallel.overlap_param_gather,
        use_distributed_optimizer=config.parallel.use_distributed_optimizer,
        bucket_size=config.parallel.ddp_bucket_size,
        fp8_param_gather=config.fp8.fp8_param_gather)


def force_param_sync(config, chunks, optimizer) -> None:
    """Under --overlap-param-gather, every parameter all-gathered now (Megatron-LM's
    ``force_param_sync``; ``chunks``: the DDP-wrapped ones): before a checkpoint, an
    evaluation or the end of the run reads the model, since the forward pre-hooks gather
    a bucket only when a training forward first uses it."""
    if not config.parallel.overlap_param_gather:
        return
    optimizer.prepare_model_params_for_param_sync()
    for chunk in chunks:
        chunk.start_param_sync(force_sync=True)


def _encoder_optimizer_keys(optimizer, config) -> None:
    """An encoder rank's distributed optimizer saves its dp_reshardable state under keys of
    its own: Megatron-Core names them by ``data_parallel_group_idx`` (the rank in the
    model-parallel group), which the encoders' own grid numbers from 0 as the LLM's does,
    so both would claim ``optimizer.distributed.dp_group_idx_0...`` with other shapes."""
    own = world_ranks(config).own_encoder(torch.distributed.get_rank())
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if hasattr(opt, "data_parallel_group_idx"):
            opt.data_parallel_group_idx = f"encoder{own or 0}_{opt.data_parallel_group_idx}"


def setup_model_and_optimizer(config, chunks: List[MultimodalModel], timers=None):
    """DDP-wrapped chunks, Megatron-Core's optimizer and LR scheduler (``config``: the
    RunConfig); ``timers`` (Megatron-Core's) go where the schedules and the optimizer
    read them."""
    train, log = config.training, config.logging
    model_config = chunks[0].config  # the one the schedules read their hooks from
    ddp = [DistributedDataParallel(config=chunk.config, ddp_config=ddp_config(config),
                                   module=Float16Module(chunk.config, chunk) if train.bf16
                                   else chunk)
           for chunk in chunks]
    optimizer_config = OptimizerConfig(
        optimizer="adam", lr=train.lr, min_lr=train.min_lr, weight_decay=train.weight_decay,
        adam_beta1=train.adam_beta1, adam_beta2=train.adam_beta2, adam_eps=train.adam_eps,
        clip_grad=train.clip_grad, bf16=train.bf16, params_dtype=model_config.params_dtype,
        use_distributed_optimizer=config.parallel.use_distributed_optimizer,
        log_num_zeros_in_grad=log.log_num_zeros_in_grad,
        barrier_with_L1_time=log.barrier_with_L1_time, timers=timers)
    optimizer = get_megatron_optimizer(  # --vision-lr ...: per-module groups
        optimizer_config, ddp,
        config_overrides(optimizer_config, module_rates(train), train))
    gbs = train.global_batch_size
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=train.lr_warmup_init, max_lr=train.lr, min_lr=train.min_lr,
        lr_warmup_steps=train.lr_warmup_iters * gbs, lr_decay_steps=train.lr_decay_iters * gbs,
        lr_decay_style=train.lr_decay_style, start_wd=train.weight_decay,
        end_wd=train.weight_decay, wd_incr_steps=train.train_iters * gbs,
        wd_incr_style="constant")
    # The hooks Megatron-LM's training loop installs on the model config.
    model_config.grad_scale_func = optimizer.scale_loss
    model_config.finalize_model_grads_func = finalize_model_grads
    model_config.timers = timers
    model_config.barrier_with_L1_time = log.barrier_with_L1_time
    if (config.encoder_schedule.encoder_schedule == "separate" and on_encoder_rank(config)
            and config.parallel.use_distributed_optimizer):
        _encoder_optimizer_keys(optimizer, config)
    if config.parallel.overlap_grad_reduce:
        no_sync = [chunk.no_sync for chunk in ddp]
        model_config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    return ddp, optimizer, scheduler
