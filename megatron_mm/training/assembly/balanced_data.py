"""The training data iterator for ``--data-balance``: packed, rank-balanced micro-batches.

Each sample's work is measured once up front (images and token count, no image decoding);
the balance bounds are searched for this dataset at this data-parallel size (or taken from
``--data-balance-bounds``), with the packed length capped at ``--seq-length``; then every
rank draws its share from the same deterministic ``BalancedSampler`` plan (an encoder rank
of ``--encoder-schedule separate`` draws every LLM replica's share, on the LLM's data-parallel
size).
``--micro-batch-size`` is the target mean number of samples per packed micro-batch, so a
global batch holds about ``--global-batch-size`` samples; resuming at iteration i skips
i x (micro-batches per step) x (data-parallel size) packed micro-batches.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.utils.data import DataLoader

from ...config import ConfigError
from ...data.packing import collate_packed
from ...data.processing import tokenize_record
from ..config.fp8_args import llm_sequence_multiple
from ...plan.balance import BalancedSampler, SampleLoad, parse_bounds, search_bounds


def sample_loads(dataset) -> list[SampleLoad]:
    """Vision work and LLM work (tokens, media tokens included) per record."""
    return [SampleLoad(vision_work(dataset, rec),
                       len(tokenize_record(rec, dataset.tokenizer,
                                           dataset.media_token_counts).ids))
            for rec in dataset.records]


def vision_work(dataset, rec) -> int:
    """A record's vision encoder work: what its modalities' processors count
    (``vision_work(ref, where)``: Qwen2.5-VL's patches per image or video), else one per
    image (fixed-size images all cost the same)."""
    procs, work = getattr(dataset, "processors", None) or {}, 0
    for modality, refs in rec.media.items():
        count = getattr(procs.get(modality), "vision_work", None)
        if count is not None:
            work += sum(count(ref, rec.where()) for ref in refs)
        elif modality == "image":
            work += len(refs)
    return work


def balanced_batch_iterators(config, dataset, tokenizer, consumed_samples: int,
                              shares: list) -> list:
    """One iterator per ``DataShare`` (data_setup.py; all of the same size), on one plan."""
    data, train, seq_length = config.data, config.training, config.model.seq_length
    loads = sample_loads(dataset)
    for rec, load in zip(dataset.records, loads):
        if load.tokens > seq_length:
            advice = "".join(p.overflow_advice(rec, load.tokens, seq_length)
                             for p in (dataset.processors or {}).values()
                             if hasattr(p, "overflow_advice"))  # InternVL: its tiles
            raise ConfigError(f"{rec.where()}: {load.tokens} tokens exceed --seq-length "
                              f"{seq_length} (the packed sequence length){advice}")
    dp = shares[0].size
    bounds = parse_bounds(data.data_balance_bounds)
    if bounds is None:
        best = search_bounds(loads, dp, train.micro_batch_size, data.data_balance,
                             data.data_balance_iters, train.seed, max_tokens=seq_length)
        bounds, m = best.bounds, best.metrics
        if torch.distributed.get_rank() == 0:
            print(f" > data balance {data.data_balance}: bounds {bounds}; "
                  f"{m.samples_per_microbatch:.2f} samples per micro-batch, vision imbalance "
                  f"{m.vision_imbalance:.4f}, LLM imbalance {m.llm_imbalance:.4f}", flush=True)
    elif bounds.max_tokens > seq_length:
        raise ConfigError(f"--data-balance-bounds: {bounds.max_tokens} tokens per packed "
                          f"sequence exceed --seq-length {seq_length}")
    return [_loader(config, dataset, tokenizer, BalancedSampler(
        loads, bounds, share.rank, dp, train.num_microbatches, seed=train.seed,
        consumed_microbatches=consumed_samples // train.micro_batch_size,
        method=data.data_balance, iterations=data.data_balance_iters,
        sample_names=[rec.where() for rec in dataset.records])) for share in shares]


def _loader(config, dataset, tokenizer, sampler):
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=config.data.num_workers,
                        collate_fn=partial(collate_packed, pad_id=tokenizer.pad_id,
                                           pad_to_multiple_of=llm_sequence_multiple(
                                               config.fp8_settings, config.parallel)),
                        pin_memory=torch.cuda.is_available(),
                        generator=torch.Generator().manual_seed(config.training.seed))
    return iter(loader)
