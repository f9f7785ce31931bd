"""The training loop: Megatron-LM's ``pretrain`` for multimodal models, on Megatron-Core."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Callable, List, Optional

import torch
from megatron.core import parallel_state
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer.module import Float16Module
from torch.utils.data import DataLoader

from ..config import ConfigError
from ..data import (
    DataRecordError,
    ImageProcessorConfig,
    MegatronPretrainingSampler,
    MultimodalDataset,
    build_tokenizer,
    collate,
    prepare_digits,
)
from ..data.audio import AudioProcessorConfig, ClipTokenCount
from ..data.spoken_digits import prepare_spoken_digits
from ..models import BuildSettings, MultimodalModel, build_model
from ..models.multimodal import ENCODER_MODALITY, MediaMismatchError
from ..models.specs import (
    CPAttentionChoice, choose_cp_attention, default_transformer_impl,
    transformer_engine_importable)
from .attention import AttentionSettings
from .balanced_data import balanced_batch_iterator
from .checkpointing import CheckpointError, load_checkpoint, save_checkpoint, saved_args
from .encoder_schedule import build_executor, encoder_pipeline_plan, separate_encoder
from .evaluation import answer_accuracy, evaluate_loss
from .initialize import device, initialize_distributed, set_random_seed
from .partition_trials import search_partition
from .pipeline_plan import describe_encoder_plan, describe_plan, plan_pipeline
from .recompute_plan import describe_choice, recompute_layers_per_chunk
from .sequence_parallel import sequence_multiple
from .step import TokenCounter, train_step

# Errors caused by the user's flags or data; scripts report them without a traceback.
USER_ERRORS = (ConfigError, DataRecordError, CheckpointError, MediaMismatchError,
               FileNotFoundError)


def print_rank_0(msg: str) -> None:
    if torch.distributed.get_rank() == 0:
        print(msg, flush=True)


def print_rank_last(msg: str) -> None:
    if torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
        print(msg, flush=True)


def cp_attention_choice(args) -> CPAttentionChoice:
    """Which CP core attention the LLM runs, from the flags and this machine."""
    return choose_cp_attention(
        args.context_parallel_size, args.transformer_impl or default_transformer_impl(),
        transformer_engine_importable(), torch.cuda.is_available(),
        media_attention=args.media_attention, packed=args.data_balance != "none",
        assignment=args.context_parallel_assignment, cp_comm_type=args.cp_comm_type)


def build_settings(args, placements=None) -> BuildSettings:
    impl = args.transformer_impl or default_transformer_impl()
    cpu_init = args.use_cpu_initialization or not torch.cuda.is_available()
    cp = cp_attention_choice(args)
    replicas = getattr(args, "encoder_replicas", None)  # an encoder TP below the LLM's
    return BuildSettings(
        cp_attention=cp.kind, cp_comm_type=cp.cp_comm_type,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        encoder_tensor_model_parallel_size=(replicas.tensor_model_parallel_size
                                            if replicas else None),
        encoder_tp_group=replicas.tp_group if replicas else None,
        encoder_data_parallel_group=replicas.data_parallel_group if replicas else None,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        context_parallel_size=args.context_parallel_size, transformer_impl=impl, bf16=args.bf16, hidden_dropout=args.hidden_dropout,
        sequence_parallel=getattr(args, "sequence_parallel", False),
        attention_dropout=args.attention_dropout, init_method_std=args.init_method_std,
        use_cpu_initialization=cpu_init, placements=placements,
        recompute_granularity=getattr(args, "recompute_granularity", None),
        recompute_method=getattr(args, "recompute_method", None),
        recompute_num_layers=getattr(args, "recompute_num_layers", None))


def data_paths(args) -> tuple[str, str]:
    if args.data_path is None:  # built-in data: digits, or spoken + written digits with audio
        cache = args.data_cache_path or os.path.join(os.path.expanduser("~"), ".cache",
                                                     "megatron_mm")
        audio = "audio" in args.model_config.encoders
        out = os.path.join(cache, "spoken_digits" if audio else "digits")
        if torch.distributed.get_rank() == 0:
            try:
                (prepare_spoken_digits if audio else prepare_digits)(out)
            except FileNotFoundError as e:  # no espeak-ng: every rank must stop, not hang
                error = e
            else:
                error = None
        else:
            error = None
        failed = torch.tensor([int(error is not None)], device=device())
        torch.distributed.all_reduce(failed)
        if error is not None:
            raise error
        if failed.item():
            raise FileNotFoundError("the built-in data could not be prepared (see rank 0)")
        return os.path.join(out, "train.jsonl"), os.path.join(out, "valid.jsonl")
    if os.path.isdir(args.data_path):
        train = os.path.join(args.data_path, "train.jsonl")
        valid = args.valid_data_path or os.path.join(args.data_path, "valid.jsonl")
    else:
        train, valid = args.data_path, args.valid_data_path
    for flag, path in (("--data-path", train), ("--valid-data-path", valid)):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{flag}: {path} does not exist")
    return train, valid


def image_processor_config(args) -> ImageProcessorConfig:
    if args.image_processor_config:  # a Hugging Face preprocessor_config.json
        from ..hf.image_processor import image_processor_from_hf

        return image_processor_from_hf(args.image_processor_config)
    return ImageProcessorConfig(image_size=args.img_h)


def audio_processor_config(args) -> Optional[AudioProcessorConfig]:
    enc = args.model_config.encoders.get("audio")
    if enc is None:
        return None
    return AudioProcessorConfig(num_mel_bins=enc.num_mel_bins, max_frames=enc.max_frames)


def media_token_counts(args) -> dict:
    """Placeholder tokens per item: fixed for images, from each clip's length for audio."""
    counts = {}
    for name, enc in args.model_config.encoders.items():
        modality = ENCODER_MODALITY[enc.model_type]
        if modality == "audio":
            counts[modality] = ClipTokenCount(audio_processor_config(args), enc.output_tokens)
        else:
            counts[modality] = enc.num_output_tokens
    return counts


def build_datasets(args, tokenizer):
    counts = media_token_counts(args)
    image_cfg = image_processor_config(args)
    audio_cfg = audio_processor_config(args)
    train, valid = data_paths(args)
    return tuple(MultimodalDataset(p, tokenizer, counts, image_cfg, max_seq_length=args.seq_length,
                                   audio_cfg=audio_cfg)
                 for p in (train, valid))


def batch_iterators(args, dataset, tokenizer, consumed_samples: int, shuffle: bool):
    """The iterator the schedule takes: one, or one per model chunk (virtual stages), each
    yielding the same micro-batches."""
    make = partial(batch_iterator, args, dataset, tokenizer, consumed_samples, shuffle)
    vpp = args.virtual_pipeline_model_parallel_size
    return make() if vpp is None else [make() for _ in range(vpp)]


def batch_iterator(args, dataset, tokenizer, consumed_samples: int, shuffle: bool):
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
                                           pad_to_multiple_of=sequence_multiple(args)),
                        generator=torch.Generator().manual_seed(args.seed))
    return iter(loader)


def build_model_chunks(args, tokenizer) -> List[MultimodalModel]:
    """This rank's pipeline chunks: one, or one per virtual stage (interleaved 1F1B), each
    holding the modules the pipeline plan gives it."""
    if separate_encoder(args):
        plan = encoder_pipeline_plan(args)
        placements = plan.placements
        args.schedule_executor = build_executor(args, plan)
        print_rank_0(describe_encoder_plan(args, plan))
        recompute = [args.recompute_num_layers] * len(placements)
    else:
        part, placements = plan_pipeline(args)
        if args.pipeline_model_parallel_size > 1:
            print_rank_0(describe_plan(args, part))
        if getattr(args, "recompute_memory_budget", None) is not None:
            print_rank_0(describe_choice(args, part))
        recompute = recompute_layers_per_chunk(args, part)
    settings = build_settings(args, placements)
    pp, rank = args.pipeline_model_parallel_size, parallel_state.get_pipeline_model_parallel_rank()
    vpp = args.virtual_pipeline_model_parallel_size
    chunks = []
    for vp in range(vpp) if vpp else [None]:
        chunk_settings = dataclasses.replace(
            settings, recompute_num_layers=recompute[(vp or 0) * pp + rank])
        chunks.append(build_model(
            args.model_config, chunk_settings,
            {ENCODER_MODALITY[enc.model_type]: tokenizer.media_token_id(
                ENCODER_MODALITY[enc.model_type]) for enc in args.model_config.encoders.values()},
            placement=placements[(vp or 0) * pp + rank], vp_stage=vp))
        if torch.cuda.is_available():  # as Megatron-LM's get_model: host-built modules too
            chunks[-1].cuda(torch.cuda.current_device())
    replicas = getattr(args, "encoder_replicas", None)
    if replicas is not None:  # equal encoder replicas, each shard counted once in norms
        pieces = [p for chunk in chunks for p in chunk.encoder_piece_parameters()]
        replicas.sync_params(pieces)
        replicas.mark_duplicates(pieces)
    return chunks


def setup_model_and_optimizer(args, chunks: List[MultimodalModel]):
    config = chunks[0].config  # the one the schedules read their hooks from
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=args.overlap_grad_reduce,
        use_distributed_optimizer=args.use_distributed_optimizer)
    ddp = [DistributedDataParallel(config=chunk.config, ddp_config=ddp_config,
                                   module=Float16Module(chunk.config, chunk) if args.bf16
                                   else chunk)
           for chunk in chunks]
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        clip_grad=args.clip_grad, bf16=args.bf16, params_dtype=config.params_dtype,
        use_distributed_optimizer=args.use_distributed_optimizer), ddp)
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
    if args.overlap_grad_reduce:
        no_sync = [chunk.no_sync for chunk in ddp]
        config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    return ddp, optimizer, scheduler


def training_log(args, iteration: int, loss: float, grad_norm, lr: float, elapsed: float,
                 tokens_per_second: float, skipped: int) -> None:
    consumed = iteration * args.global_batch_size
    line = (f" [{datetime.now():%Y-%m-%d %H:%M:%S}] iteration {iteration:8d}/{args.train_iters:8d}"
            f" | consumed samples: {consumed:12d}"
            f" | elapsed time per iteration (ms): {elapsed * 1000:.1f}"
            f" | tokens per second: {tokens_per_second:.1f}"
            f" | learning rate: {lr:.6E}"
            f" | global batch size: {args.global_batch_size:5d}"
            f" | lm loss: {loss:.6E}"
            f" | loss scale: 1.0"
            f" | grad norm: {float(grad_norm or 0.0):.3f}"
            f" | number of skipped iterations: {skipped:3d}"
            f" | number of nan iterations: {int(loss != loss):3d} |")
    print_rank_last(line)


def evaluate_and_print(args, iteration, model_chunks, valid_ds, tokenizer,
                       label: str = "") -> dict:
    batches = batch_iterators(args, valid_ds, tokenizer, 0, shuffle=False)
    loss = evaluate_loss(args, model_chunks, batches)
    n = min(len(valid_ds), args.eval_iters * args.global_batch_size)
    accuracy = answer_accuracy(args, model_chunks, valid_ds, tokenizer, range(n))
    line = (f" validation loss at iteration {iteration}{label} | lm loss value: {loss:.6E}"
            f" | lm loss PPL: {math.exp(min(20.0, loss)):.6E}"
            f" | val answer accuracy: {accuracy:.4f} ({n} samples) |")
    print_rank_last("-" * len(line) + "\n" + line + "\n" + "-" * len(line))
    return {"val_loss": loss, "val_accuracy": accuracy}


@dataclass
class TrainingCallbacks:
    """Hooks into the loop (tests use them to watch the model and read gradients)."""

    on_model_built: Optional[Callable] = None  # (chunks, wrapped chunks, optimizer)
    on_step: Optional[Callable] = None  # (iteration, chunks, loss), before grads are cleared


@dataclass
class TrainingSetup:
    """Everything a training loop needs, built from the flags."""

    tokenizer: object
    train_ds: MultimodalDataset
    valid_ds: MultimodalDataset
    model: List[MultimodalModel]  # this rank's chunks
    model_chunks: list  # the same, wrapped (DDP, Float16Module)
    optimizer: object
    scheduler: OptimizerParamScheduler


def setup_training(args) -> TrainingSetup:
    """Process groups, tokenizer, data, model chunks, optimizer and scheduler."""
    initialize_distributed(args)
    set_random_seed(args.seed)
    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model,
                                image_token_id=args.image_token_id,
                                audio_token_id=args.audio_token_id)
    lm = args.model_config.language
    lm.vocab_size = tokenizer.vocab_size
    if args.load:  # keep the checkpoint's vocabulary padding, whatever TP it was saved at
        lm.padded_vocab_size = saved_args(args).get("padded_vocab_size")
    args.padded_vocab_size = lm.vocab_size_padded(args.tensor_model_parallel_size)
    train_ds, valid_ds = build_datasets(args, tokenizer)
    args.attention = AttentionSettings.from_args(args, tokenizer,
                                                 cp_attention_choice(args).kind)
    if args.context_parallel_size > 1:
        print_rank_0(f"> context parallel attention: {cp_attention_choice(args).reason}")
    print_rank_0(f"> building multimodal model ({build_settings(args).transformer_impl} "
                 f"specs), {len(train_ds)} train / {len(valid_ds)} validation samples ...")
    if args.pipeline_partition == "search":
        search_partition(
            args, build=lambda: setup_model_and_optimizer(args, build_model_chunks(args,
                                                                                   tokenizer)),
            batches=lambda: batch_iterators(args, train_ds, tokenizer, 0, shuffle=True),
            step=lambda run, data: train_step(args, run[0], run[1], run[2], data),
            reseed=lambda: set_random_seed(args.seed), log=print_rank_0)
    model = build_model_chunks(args, tokenizer)
    n_params = sum(p.numel() for chunk in model for p in chunk.parameters())
    n_train = sum(p.numel() for chunk in model for p in chunk.parameters() if p.requires_grad)
    print_rank_0(f" > number of parameters on (tensor, pipeline) model parallel rank "
                 f"({parallel_state.get_tensor_model_parallel_rank()}, "
                 f"{parallel_state.get_pipeline_model_parallel_rank()}): {n_params} "
                 f"({n_train} trainable)")
    model_chunks, optimizer, scheduler = setup_model_and_optimizer(args, model)
    return TrainingSetup(tokenizer, train_ds, valid_ds, model, model_chunks, optimizer,
                         scheduler)


def pretrain(args, callbacks: Optional[TrainingCallbacks] = None) -> dict:
    """Train as the flags say; returns a summary (losses per iteration, last evaluation)."""
    callbacks = callbacks or TrainingCallbacks()
    run = setup_training(args)
    tokenizer, train_ds, valid_ds = run.tokenizer, run.train_ds, run.valid_ds
    model, model_chunks = run.model, run.model_chunks
    optimizer, scheduler = run.optimizer, run.scheduler
    if callbacks.on_model_built is not None:
        callbacks.on_model_built(model, model_chunks, optimizer)

    iteration = load_checkpoint(args, model, optimizer, scheduler) if args.load else 0
    if iteration:
        print_rank_0(f" > loaded checkpoint from {args.load} at iteration {iteration}")
    train_iter = batch_iterators(args, train_ds, tokenizer,
                                 iteration * args.global_batch_size, shuffle=True)
    if isinstance(train_iter, list):  # count the tokens of one chunk's copy of the data
        train_iter[0] = counter = TokenCounter(train_iter[0])
    else:
        train_iter = counter = TokenCounter(train_iter)
    summary = {"losses": {}, "grad_norms": {}}
    skipped, last_saved = 0, None
    interval_start = time.perf_counter()
    while iteration < args.train_iters:
        loss, grad_norm, ok = train_step(args, model_chunks, optimizer, scheduler, train_iter)
        iteration += 1
        skipped += int(not ok)
        summary["losses"][iteration] = loss
        summary["grad_norms"][iteration] = float(grad_norm or 0.0)
        if callbacks.on_step is not None:
            callbacks.on_step(iteration, model, loss)
        if iteration % args.log_interval == 0:
            elapsed = time.perf_counter() - interval_start
            training_log(args, iteration, loss, grad_norm,
                         scheduler.get_lr(optimizer.param_groups[0]),
                         elapsed / args.log_interval, counter.take_global() / elapsed,
                         skipped)
            interval_start = time.perf_counter()
        if args.save and args.save_interval and iteration % args.save_interval == 0:
            save_checkpoint(args, iteration, model, optimizer, scheduler)
            last_saved = iteration
            print_rank_0(f"  successfully saved checkpoint at iteration {iteration} to "
                         f"{args.save}")
        if iteration % args.eval_interval == 0 and iteration < args.train_iters:
            summary.update(evaluate_and_print(args, iteration, model_chunks, valid_ds,
                                              tokenizer))
        if iteration % args.log_interval == 0:
            interval_start = time.perf_counter()  # evaluation and saving are not step time
    if args.save and last_saved != iteration:
        save_checkpoint(args, iteration, model, optimizer, scheduler)
        print_rank_0(f"  successfully saved checkpoint at iteration {iteration} to {args.save}")
    if not args.skip_final_eval:
        summary.update(evaluate_and_print(args, iteration, model_chunks, valid_ds, tokenizer,
                                          label=" on validation set"))
    summary["iteration"] = iteration
    summary["pipeline_partition"] = args.pipeline_partition  # what search kept, if it ran
    return summary
