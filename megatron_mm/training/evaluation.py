"""Validation: Megatron's ``lm loss`` on held-out batches, and answer accuracy by greedy
decoding through the same pipeline schedules as training (any TP / PP layout)."""

from __future__ import annotations

import itertools
import math
from typing import List, Sequence

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

from ..data import collate
from .initialize import device
from .step import batch_to_device, reduce_lm_loss, run_schedule


def evaluate_loss(args, model: List, batches) -> float:
    """Token-weighted ``lm loss`` over ``--eval-iters`` global batches."""
    for chunk in model:
        chunk.eval()
    losses = []
    with torch.no_grad():
        for _ in range(args.eval_iters):
            losses += run_schedule(args, model, batches, forward_only=True)
    for chunk in model:
        chunk.train()
    return reduce_lm_loss(losses)


def next_tokens(model: List, batch: dict, vocab_size: int) -> torch.Tensor:
    """Greedy next token of each row, by one forward-only pass through the pipeline (the
    schedule Megatron-Core picks for the layout); every pipeline rank gets the result."""
    def forward_step(data_iterator, chunk):
        b = next(data_iterator)
        logits = chunk(b["tokens"], b["position_ids"], b["media"])  # [B, S, V / TP] at the end

        def argmax_last(output, non_loss_data=True):
            last = gather_from_tensor_model_parallel_region(output[:, -1].contiguous()).float()
            last[:, vocab_size:] = -math.inf  # media ids and TP vocab padding are not text
            return last.argmax(-1)
        return logits, argmax_last

    tokens = batch["tokens"]
    collected = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([batch]), model=model,
        num_microbatches=1, seq_length=tokens.shape[1], micro_batch_size=tokens.shape[0],
        forward_only=True, collect_non_loss_data=True)
    nxt = collected[0] if parallel_state.is_pipeline_last_stage() else torch.empty_like(
        tokens[:, 0])
    torch.distributed.broadcast(nxt, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                                group=parallel_state.get_pipeline_model_parallel_group())
    return nxt


@torch.no_grad()
def greedy_generate(model: List, batch: dict, max_new_tokens: int, eos_id: int,
                    vocab_size: int) -> List[List[int]]:
    """Greedy continuation of prompts of equal length; returns new ids up to EOS."""
    out = [[] for _ in range(batch["tokens"].shape[0])]
    done = torch.zeros(len(out), dtype=torch.bool, device=batch["tokens"].device)
    batch = dict(batch)
    for _ in range(max_new_tokens):
        nxt = next_tokens(model, batch, vocab_size)
        for i, t in enumerate(nxt.tolist()):
            if not done[i]:
                out[i].append(t)
        done |= nxt == eos_id
        if bool(done.all()):
            break
        tokens = torch.cat([batch["tokens"], nxt[:, None]], dim=1)
        batch["tokens"] = tokens
        batch["position_ids"] = torch.arange(tokens.shape[1], device=tokens.device).expand_as(
            tokens)
    return [ids[:-1] if ids and ids[-1] == eos_id else ids for ids in out]


def normalize_answer(text: str) -> str:
    return " ".join(text.lower().strip().rstrip(".").split())


def answer_accuracy(args, model: List, dataset, tokenizer, indices: Sequence[int]) -> float:
    """Share of ``indices`` whose greedy answer equals the reference answer.

    Split over data-parallel ranks; prompts of equal length decode as one batch.
    """
    dp_rank = parallel_state.get_data_parallel_rank()
    dp_size = parallel_state.get_data_parallel_world_size()
    mine = list(indices)[dp_rank::dp_size]
    for chunk in model:
        chunk.eval()
    prompts = []
    for idx in mine:
        sample = dataset[idx]
        n = sample.prompt_len
        sample.tokens, sample.labels = sample.tokens[:n], sample.labels[:n]
        sample.loss_mask = sample.loss_mask[:n]
        prompts.append(sample)
    prompts.sort(key=lambda s: len(s.tokens))
    correct = 0
    for _, group in itertools.groupby(prompts, key=lambda s: len(s.tokens)):
        group = list(group)
        for start in range(0, len(group), args.micro_batch_size):
            chunk = group[start:start + args.micro_batch_size]
            batch = batch_to_device(collate(chunk, pad_id=tokenizer.pad_id))
            generated = greedy_generate(model, batch, args.eval_max_new_tokens,
                                        tokenizer.eos_id, tokenizer.base_vocab_size)
            for sample, ids in zip(chunk, generated):
                guess = normalize_answer(tokenizer.detokenize(ids))
                correct += int(guess == normalize_answer(sample.answer))
    for chunk in model:
        chunk.train()
    counts = torch.tensor([correct, len(mine)], dtype=torch.float64, device=device())
    torch.distributed.all_reduce(counts, group=parallel_state.get_data_parallel_group())
    return (counts[0] / counts[1].clamp(min=1)).item()
