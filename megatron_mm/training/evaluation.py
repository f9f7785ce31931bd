"""Validation: Megatron's ``lm loss`` on held-out batches, and answer accuracy by greedy
decoding (the prompt is encoded once, media included; each new token extends it)."""

from __future__ import annotations

import itertools
import math
from typing import List, Sequence

import torch
from megatron.core import parallel_state
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


@torch.no_grad()
def greedy_generate(model, batch: dict, max_new_tokens: int, eos_id: int,
                    vocab_size: int) -> List[List[int]]:
    """Greedy continuation of prompts of equal length; returns new ids up to EOS."""
    tokens, positions = batch["tokens"], batch["position_ids"]
    embeddings = model.embed(tokens, positions, batch["media"])  # [S, B, H]
    lm = model.language_model
    out = [[] for _ in range(tokens.shape[0])]
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    for _ in range(max_new_tokens):
        s = embeddings.shape[0]
        pos = torch.arange(s, device=tokens.device).expand(tokens.shape[0], -1)
        logits = lm(input_ids=None, position_ids=pos, attention_mask=None,
                    decoder_input=embeddings)  # [B, S, V / TP]
        last = gather_from_tensor_model_parallel_region(logits[:, -1].contiguous()).float()
        last[:, vocab_size:] = -math.inf  # media ids and TP vocab padding are not text
        nxt = last.argmax(-1)
        for i, t in enumerate(nxt.tolist()):
            if not done[i]:
                out[i].append(t)
        done |= nxt == eos_id
        if bool(done.all()):
            break
        nxt_emb = lm.embedding(input_ids=nxt[:, None], position_ids=pos[:, -1:] + 1)
        embeddings = torch.cat([embeddings, nxt_emb.to(embeddings.dtype)], dim=0)
    return [ids[:-1] if ids and ids[-1] == eos_id else ids for ids in out]


def normalize_answer(text: str) -> str:
    return " ".join(text.lower().strip().rstrip(".").split())


def answer_accuracy(args, model, dataset, tokenizer, indices: Sequence[int]) -> float:
    """Share of ``indices`` whose greedy answer equals the reference answer.

    Split over data-parallel ranks; prompts of equal length decode as one batch.
    """
    dp_rank = parallel_state.get_data_parallel_rank()
    dp_size = parallel_state.get_data_parallel_world_size()
    mine = list(indices)[dp_rank::dp_size]
    model.eval()
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
    model.train()
    counts = torch.tensor([correct, len(mine)], dtype=torch.float64, device=device())
    torch.distributed.all_reduce(counts, group=parallel_state.get_data_parallel_group())
    return (counts[0] / counts[1].clamp(min=1)).item()
