"""The run's data: the datasets (the flags' sources, or the built-in data the encoders'
families declare), each encoder family's media processor, and the batch iterators the
schedules take (padded, balanced, or Energon's loader resumed from the checkpoint)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch
from megatron.core import parallel_state
from torch.utils.data import DataLoader

from ...config import ConfigError
from ...data import ImageProcessorConfig, MegatronPretrainingSampler, collate
from ...data.loaders import (EncodingSettings, EnergonTrainData, build_train_valid_datasets,
                            load_dataloader_state)
from ...data.sources import resolve_sources
from ...families import builtin_data_for, family_of, modalities_of, resolve
from ...runtime.batch_broadcast import read_on_first_tp_rank
from ...runtime.collective_device import collective_device
from .balanced_data import balanced_batch_iterators
from .build_settings import transformer_impl
from ..checkpoint.checkpointing import iteration_dir, locate_checkpoint
from .data_check import check_before_training
from ..config.fp8_args import llm_sequence_multiple
from ..rank_print import print_rank_0


def data_paths(config) -> Optional[tuple[str, str]]:
    if config.data.data_path is None:  # built-in data: the one the encoders' families declare
        encoders = list(config.model_config.encoders.values())
        data = builtin_data_for(encoders)
        if data is None:
            raise ConfigError("no built-in data holds every modality of these encoders ("
                              + ", ".join(sorted({m for c in encoders for m in modalities_of(c)}))
                              + "): pass --data-path")
        cache = config.data.data_cache_path or os.path.join(os.path.expanduser("~"), ".cache",
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


def media_processors(config) -> dict:
    """Modality -> the media processor of the encoder family that reads it."""
    procs = {}
    for enc in config.model_config.encoders.values():
        proc = family_of(enc).media_processor(config.model, enc)  # one, or one per modality
        for p in proc if isinstance(proc, (list, tuple)) else (proc,):
            procs[p.modality] = p
    return procs


def build_datasets(config, tokenizer):
    builtin = data_paths(config)
    sources = (resolve_sources([builtin[0]], builtin[1]) if builtin
               else resolve_sources(config.data.data_path, config.data.valid_data_path))
    if sources.kind == "jsonl" and config.data.bad_record_policy == "fail":
        check_before_training(sources.train + (sources.valid if sources.valid_kind == "jsonl"
                                               else []))
    procs = media_processors(config)
    image = procs.get("image")
    audio = procs.get("audio")
    encoding = EncodingSettings(
        tokenizer, {m: p.token_count for m, p in procs.items()},
        getattr(image, "cfg", ImageProcessorConfig(image_size=config.model.img_h)),
        config.model.seq_length, getattr(audio, "cfg", None), config.data.bad_record_policy,
        llm_sequence_multiple(config.fp8_settings, config.parallel), processors=procs)
    gbs = config.training.global_batch_size
    return build_train_valid_datasets(sources, encoding,
                                      valid_limit=config.validation.eval_iters * gbs,
                                      global_batch_size=gbs)


def energon_state(checkpoint, consumed_samples: int, dp_rank: int):
    """Data-parallel rank ``dp_rank``'s Energon loader state in the checkpoint resumed
    from."""
    if not consumed_samples or not checkpoint.load:
        return None
    path = iteration_dir(checkpoint.load, locate_checkpoint(checkpoint))
    return load_dataloader_state(path, dp_rank, print_rank_0)


@dataclass(frozen=True)
class DataShare:
    """Whose micro-batches an iterator reads: data-parallel rank ``rank`` of ``size``
    (``group``: their process group, Energon's, where this process is in it)."""

    rank: int
    size: int
    group: object = None


def batch_iterators(config, dataset, tokenizer, consumed_samples: int, shuffle: bool,
                    replicas: Optional[int] = None):
    """The iterator the schedule takes: one, or one per model chunk (virtual stages), each
    yielding the same micro-batches. ``replicas``: the LLM's data-parallel size when this
    rank reads every LLM replica's micro-batches (an encoder rank of ``--encoder-schedule
    separate``, which encodes them all): each replica's, read as that replica reads them
    (the same sampler, balanced plan or Energon loader state), in turn (replica d's m-th
    micro-batch is the ``m * replicas + d``-th)."""
    make = partial(batch_iterator, config, dataset, tokenizer, consumed_samples, shuffle,
                   replicas)
    vpp = config.parallel.virtual_pipeline_model_parallel_size
    return make() if vpp is None else [make() for _ in range(vpp)]


def stage_reads_media(plan, pipeline_rank: int) -> bool:
    """Whether pipeline rank ``pipeline_rank`` reads media contents (pixels, mel frames):
    a chunk there embeds an encoder's input, or (--encoder-schedule coarse | bubble) an
    encoder's first piece runs there. Elsewhere the layout needs only their shapes."""
    pp = plan.partition.pipeline_model_parallel_size
    if plan.encoder_plan is not None and any(
            p.ranks and p.ranks[0] == pipeline_rank for p in plan.encoder_plan.pieces):
        return True
    return any(c.chunk % pp == pipeline_rank and not c.encoder_separate
               and any(e.embed for e in c.encoders) for c in plan.placements)


def tensor_parallel_batches(config, plan, make, copies: Optional[int] = None):
    """``make()``'s iterator (``copies``: its list of one per model chunk) read and decoded
    on the first tensor-parallel rank only, each micro-batch broadcast to the others
    (``runtime/batch_broadcast.py``; media contents only to a stage that reads them), as
    Megatron-LM's ``get_batch`` does. Every TP rank of a stage reads at the same points of
    the same schedule; not so with encoder replicas (each reads a micro-batch when its own
    encoder actions need it) or the separate placement's encoder ranks: there each rank
    reads its own."""
    group = parallel_state.get_tensor_model_parallel_group()
    if (torch.distributed.get_world_size(group) == 1 or plan.separate is not None
            or config.encoder_replicas > 1):
        return make()
    contents = {m for enc in config.model_config.encoders.values() for m in modalities_of(enc)}
    return read_on_first_tp_rank(make, group, copies, contents, stage_reads_media(
        plan, parallel_state.get_pipeline_model_parallel_rank()))


def batch_iterator(config, dataset, tokenizer, consumed_samples: int, shuffle: bool,
                   replicas: Optional[int] = None):
    if replicas is None:
        shares = [DataShare(parallel_state.get_data_parallel_rank(),
                            parallel_state.get_data_parallel_world_size(),
                            parallel_state.get_data_parallel_group())]
    else:  # not in the replicas' group: Energon takes none
        shares = [DataShare(d, replicas) for d in range(replicas)]
    iterators = share_iterators(config, dataset, tokenizer, consumed_samples, shuffle, shares)
    # in turn: no save_state, so only the replicas' own ranks save their loaders' states
    return iterators[0] if replicas is None else _in_turn(iterators)


def _in_turn(iterators):
    while True:
        for it in iterators:
            yield next(it)


def share_iterators(config, dataset, tokenizer, consumed_samples: int, shuffle: bool,
                    shares: list) -> list:
    """One iterator per ``DataShare``: padded, balanced, or Energon's loader resumed from
    the checkpoint."""
    data, train = config.data, config.training
    if isinstance(dataset, EnergonTrainData):  # resumes from the checkpoint's loader state
        if data.packing_buffer_size and transformer_impl(config.model) != "local":
            raise ConfigError("--packing-buffer-size packs samples into one sequence with a "
                              "block-diagonal mask, which only the local specs apply: pass "
                              "--transformer-impl local")
        return [dataset.batches(
            train.micro_batch_size, share.rank, share.size, data.num_workers, train.seed,
            share.group, energon_state(config.checkpoint, consumed_samples, share.rank),
            data.packing_buffer_size, data.packing_seq_length or config.model.seq_length)
            for share in shares]
    if shuffle and data.data_balance != "none":  # training data; evaluation stays padded
        return balanced_batch_iterators(config, dataset, tokenizer, consumed_samples, shares)
    return [_padded_batch_iterator(config, dataset, tokenizer, consumed_samples, shuffle, share)
            for share in shares]


def _padded_batch_iterator(config, dataset, tokenizer, consumed_samples: int, shuffle: bool,
                           share: DataShare):
    data, train = config.data, config.training
    sampler = MegatronPretrainingSampler(
        total_samples=len(dataset), consumed_samples=consumed_samples,
        micro_batch_size=train.micro_batch_size, data_parallel_rank=share.rank,
        data_parallel_size=share.size, shuffle=shuffle, seed=train.seed,
        global_batch_size=train.global_batch_size)
    # Its own generator: the loader must not draw from the global RNG, whose state a
    # checkpoint restores (resume would otherwise be one draw off).
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=data.num_workers,
                        collate_fn=partial(collate, pad_id=tokenizer.pad_id,
                                           pad_to_multiple_of=llm_sequence_multiple(
                                               config.fp8_settings, config.parallel)),
                        pin_memory=torch.cuda.is_available(),
                        generator=torch.Generator().manual_seed(train.seed))
    return iter(loader)
