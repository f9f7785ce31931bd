"""Megatron-LM's ``pretrain`` for multimodal models, on Megatron-Core: the pieces a run is
built from (data, model chunks, optimizer); the run's state and loop are the ``Trainer``'s
(``trainer.py``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import partial
from typing import Callable, List, Optional

import torch
from megatron.core import parallel_state
from megatron.core.distributed import (
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from torch.utils.data import DataLoader

from ..config import ConfigError
from ..data import (
    DataRecordError,
    ImageProcessorConfig,
    MegatronPretrainingSampler,
    collate,
)
from ..data.loaders import (EncodingSettings, EnergonTrainData, build_train_valid_datasets,
                            load_dataloader_state)
from ..data.sources import resolve_sources
from .checkpointing import iteration_dir, locate_checkpoint
from ..models import BuildSettings, MultimodalModel, build_model
from ..families import builtin_data_for, family_of, modalities_of, resolve
from ..models.multimodal import MediaMismatchError
from ..models.fusions import Fusions, Kernels, choose_fusions
from ..models.wrappers import DistributedDataParallel, Float16Module
from ..models.specs import (
    CPAttentionChoice, choose_cp_attention, default_transformer_impl,
    require_transformer_engine, transformer_engine_importable)
from .balanced_data import balanced_batch_iterator
from .checkpointing import CheckpointError
from ..runtime.collective_device import collective_device
from .fp8_args import llm_sequence_multiple
from .fusion_args import fusion_flags

from .nan_check import NonFiniteError

# Errors caused by the user's flags or data (and a run that diverged); scripts report them
# once, without a traceback.
USER_ERRORS = (ConfigError, DataRecordError, CheckpointError, MediaMismatchError,
               FileNotFoundError, NonFiniteError)


def print_rank_0(msg: str) -> None:
    if torch.distributed.get_rank() == 0:
        print(msg, flush=True)


def print_rank_last(msg: str) -> None:
    if torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
        print(msg, flush=True)


def transformer_impl(args) -> str:
    """``--transformer-impl``, or this machine's default; Transformer Engine, asked for or
    defaulted to, must import, or its error stops the run (naming the flag)."""
    impl = args.transformer_impl or default_transformer_impl()
    if impl == "transformer_engine":
        require_transformer_engine(defaulted=args.transformer_impl is None)
    return impl


def fusions(args) -> Fusions:
    """Megatron-LM's fusions the flags leave on, where this machine has their kernels."""
    fp8 = getattr(args, "fp8_settings", None)
    return choose_fusions(fusion_flags(args), Kernels.probe(), transformer_impl(args),
                          fp8_emulation=fp8 is not None and fp8.emulation)


def cp_attention_choice(args) -> CPAttentionChoice:
    """Which CP core attention the LLM runs, from the flags and this machine."""
    return choose_cp_attention(
        args.context_parallel_size, transformer_impl(args),
        transformer_engine_importable(), torch.cuda.is_available(),
        media_attention=args.media_attention, packed=args.data_balance != "none",
        assignment=args.context_parallel_assignment, cp_comm_type=args.cp_comm_type)


def build_settings(args, placements=None, replicas=None) -> BuildSettings:
    """``replicas``: the encoder replicas' groups (an encoder TP below the LLM's)."""
    impl = transformer_impl(args)
    cpu_init = args.use_cpu_initialization or not torch.cuda.is_available()
    cp = cp_attention_choice(args)
    return BuildSettings(
        cp_attention=cp.kind, cp_comm_type=cp.cp_comm_type,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        encoder_tensor_model_parallel_size=(replicas.tensor_model_parallel_size
                                            if replicas else None),
        encoder_tp_group=replicas.tp_group if replicas else None,
        encoder_data_parallel_group=replicas.data_parallel_group if replicas else None,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        context_parallel_size=args.context_parallel_size, transformer_impl=impl, bf16=args.bf16,
        hidden_dropout=args.hidden_dropout,
        sequence_parallel=getattr(args, "sequence_parallel", False),
        attention_dropout=args.attention_dropout, init_method_std=args.init_method_std,
        use_cpu_initialization=cpu_init, placements=placements,
        recompute_granularity=getattr(args, "recompute_granularity", None),
        recompute_method=getattr(args, "recompute_method", None),
        recompute_num_layers=getattr(args, "recompute_num_layers", None),
        media_attention=args.media_attention, fp8=getattr(args, "fp8_settings", None),
        fusions=fusions(args))


def data_paths(args) -> Optional[tuple[str, str]]:
    if args.data_path is None:  # built-in data: the one the encoders' families declare
        encoders = list(args.model_config.encoders.values())
        data = builtin_data_for(encoders)
        if data is None:
            raise ConfigError("no built-in data holds every modality of these encoders ("
                              + ", ".join(sorted({m for c in encoders for m in modalities_of(c)}))
                              + "): pass --data-path")
        cache = args.data_cache_path or os.path.join(os.path.expanduser("~"), ".cache",
                                                     "megatron_mm")
        out = os.path.join(cache, data.name)
        if torch.distributed.get_rank() == 0:
            try:
                resolve(data.prepare)(out)
            except FileNotFoundError as e:  # no espeak-ng: every rank must stop, not hang
                error = e
            else:
                error = None
        else:
            error = None
        failed = torch.tensor([int(error is not None)], device=collective_device())
        torch.distributed.all_reduce(failed)
        if error is not None:
            raise error
        if failed.item():
            raise FileNotFoundError("the built-in data could not be prepared (see rank 0)")
        return os.path.join(out, "train.jsonl"), os.path.join(out, "valid.jsonl")
    return None  # --data-path given: build_datasets resolves it


def media_processors(args) -> dict:
    """Modality -> the media processor of the encoder family that reads it."""
    procs = {}
    for enc in args.model_config.encoders.values():
        proc = family_of(enc).media_processor(args, enc)  # one, or one per modality
        for p in proc if isinstance(proc, (list, tuple)) else (proc,):
            procs[p.modality] = p
    return procs


def build_datasets(args, tokenizer):
    builtin = data_paths(args)
    sources = (resolve_sources([builtin[0]], builtin[1]) if builtin
               else resolve_sources(args.data_path, args.valid_data_path))
    procs = media_processors(args)
    image = procs.get("image")
    audio = procs.get("audio")
    encoding = EncodingSettings(
        tokenizer, {m: p.token_count for m, p in procs.items()},
        getattr(image, "cfg", ImageProcessorConfig(image_size=args.img_h)), args.seq_length,
        getattr(audio, "cfg", None), args.bad_record_policy, llm_sequence_multiple(args),
        processors=procs)
    return build_train_valid_datasets(sources, encoding,
                                      valid_limit=args.eval_iters * args.global_batch_size,
                                      global_batch_size=args.global_batch_size)


def energon_state(args, consumed_samples: int):
    """This data-parallel rank's Energon loader state in the checkpoint resumed from."""
    if not consumed_samples or not args.load:
        return None
    path = iteration_dir(args.load, locate_checkpoint(args))
    return load_dataloader_state(path, parallel_state.get_data_parallel_rank(), print_rank_0)


def batch_iterators(args, dataset, tokenizer, consumed_samples: int, shuffle: bool):
    """The iterator the schedule takes: one, or one per model chunk (virtual stages), each
    yielding the same micro-batches."""
    make = partial(batch_iterator, args, dataset, tokenizer, consumed_samples, shuffle)
    vpp = args.virtual_pipeline_model_parallel_size
    return make() if vpp is None else [make() for _ in range(vpp)]


def batch_iterator(args, dataset, tokenizer, consumed_samples: int, shuffle: bool):
    if isinstance(dataset, EnergonTrainData):  # resumes from the checkpoint's loader state
        if args.packing_buffer_size and build_settings(args).transformer_impl != "local":
            raise ConfigError("--packing-buffer-size packs samples into one sequence with a "
                              "block-diagonal mask, which only the local specs apply: pass "
                              "--transformer-impl local")
        return dataset.batches(
            args.micro_batch_size, parallel_state.get_data_parallel_rank(),
            parallel_state.get_data_parallel_world_size(), args.num_workers, args.seed,
            parallel_state.get_data_parallel_group(), energon_state(args, consumed_samples),
            args.packing_buffer_size, args.packing_seq_length or args.seq_length)
    if shuffle and args.data_balance != "none":  # training data; evaluation stays padded
        return balanced_batch_iterator(args, dataset, tokenizer, consumed_samples,
                                       build_settings(args).transformer_impl)
    sampler = MegatronPretrainingSampler(
        total_samples=len(dataset), consumed_samples=consumed_samples,
        micro_batch_size=args.micro_batch_size,
        data_parallel_rank=parallel_state.get_data_parallel_rank(),
        data_parallel_size=parallel_state.get_data_parallel_world_size(),
        shuffle=shuffle, seed=args.seed, global_batch_size=args.global_batch_size)
    # Its own generator: the loader must not draw from the global RNG, whose state a
    # checkpoint restores (resume would otherwise be one draw off).
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=args.num_workers,
                        collate_fn=partial(collate, pad_id=tokenizer.pad_id,
                                           pad_to_multiple_of=llm_sequence_multiple(args)),
                        pin_memory=torch.cuda.is_available(),
                        generator=torch.Generator().manual_seed(args.seed))
    return iter(loader)


def build_model_chunks(args, tokenizer, model_config, plan, replicas=None
                       ) -> List[MultimodalModel]:
    """This rank's pipeline chunks: one, or one per virtual stage (interleaved 1F1B), each
    holding the modules ``plan`` (a TrainingPlan) gives it."""
    settings = build_settings(args, plan.placements, replicas)
    pp, rank = args.pipeline_model_parallel_size, parallel_state.get_pipeline_model_parallel_rank()
    vpp = args.virtual_pipeline_model_parallel_size
    media_ids = {m: tokenizer.media_token_id(m)
                 for enc in model_config.encoders.values() for m in modalities_of(enc)}
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


def ddp_config(args) -> DistributedDataParallelConfig:
    """Megatron-LM's DDP settings for the run; ``--fp8-param-gather`` makes the distributed
    optimizer all-gather the FP8 parameters and requantise them after each step."""
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=args.overlap_grad_reduce,
        use_distributed_optimizer=args.use_distributed_optimizer,
        fp8_param_gather=getattr(args, "fp8_param_gather", False))


def setup_model_and_optimizer(args, chunks: List[MultimodalModel], timers=None):
    """DDP-wrapped chunks, Megatron-Core's optimizer and LR scheduler; ``timers``
    (Megatron-Core's) go where the schedules and the optimizer read them."""
    config = chunks[0].config  # the one the schedules read their hooks from
    ddp = [DistributedDataParallel(config=chunk.config, ddp_config=ddp_config(args),
                                   module=Float16Module(chunk.config, chunk) if args.bf16
                                   else chunk)
           for chunk in chunks]
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        clip_grad=args.clip_grad, bf16=args.bf16, params_dtype=config.params_dtype,
        use_distributed_optimizer=args.use_distributed_optimizer,
        log_num_zeros_in_grad=getattr(args, "log_num_zeros_in_grad", False),
        barrier_with_L1_time=getattr(args, "barrier_with_L1_time", True), timers=timers),
        ddp)
    gbs = args.global_batch_size
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=args.lr_warmup_init, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=args.lr_warmup_iters * gbs, lr_decay_steps=args.lr_decay_iters * gbs,
        lr_decay_style=args.lr_decay_style, start_wd=args.weight_decay,
        end_wd=args.weight_decay, wd_incr_steps=args.train_iters * gbs,
        wd_incr_style="constant")
    # The hooks Megatron-LM's training loop installs on the model config.
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    config.timers = timers
    config.barrier_with_L1_time = getattr(args, "barrier_with_L1_time", True)
    if args.overlap_grad_reduce:
        no_sync = [chunk.no_sync for chunk in ddp]
        config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    return ddp, optimizer, scheduler


@dataclass
class TrainingCallbacks:
    """Hooks into the loop (tests use them to watch the model and read gradients)."""

    on_model_built: Optional[Callable] = None  # (chunks, wrapped chunks, optimizer)
    # (iteration, chunks, the lm loss on the device: None off the last stage), before
    # grads are cleared
    on_step: Optional[Callable] = None


def setup_training(args):
    """Process groups, tokenizer, plan, data, model chunks, optimizer and scheduler: the
    ``Trainer`` (``tokenizer``, ``train_ds``, ``model``, ``model_chunks``, ``optimizer``,
    ``scheduler``, ``plan``, ``executor`` ...)."""
    from .trainer import Trainer

    return Trainer.build(args)


def pretrain(args, callbacks: Optional[TrainingCallbacks] = None) -> dict:
    """Train as the flags say; returns a summary (losses per iteration, last evaluation)."""
    return setup_training(args).train(callbacks)
