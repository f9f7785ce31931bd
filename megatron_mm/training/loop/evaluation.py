"""Validation: Megatron's ``lm loss`` on held-out batches, and answer accuracy by greedy
decoding through the same pipeline schedules as training (any TP / PP layout)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import List, Optional, Sequence

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
from megatron.core.utils import get_attr_wrapped_model

from ...data import Sample, collate
from ...data.processing import sample_positions
from ...runtime.collective_device import collective_device
from ...runtime.host_barrier import host_barrier
from ..config.fp8_args import llm_sequence_multiple
from ..separate.generation import encoder_rounds
from ..separate.run import SeparateRun
from .step import prepare_batch, reduce_lm_loss, run_schedule
from .validation_samples import ShownAnswer, shown_answer


def evaluate_loss(config, model: List, batches, forward_backward=None, attention=None) -> float:
    """Token-weighted ``lm loss`` over ``--eval-iters`` global batches."""
    for chunk in model:
        chunk.eval()
    losses = []
    with torch.no_grad():
        for _ in range(config.validation.eval_iters):
            losses += run_schedule(config, model, batches, True, forward_backward, attention)
    for chunk in model:
        chunk.train()
    return reduce_lm_loss(losses)


def greedy_step(vocab_size: int, attention=None, last: int = -1):
    """The forward step of one greedy decoding pass (``next_tokens``): the logits' argmax
    at position ``last``, collected on the last stage. A micro-batch may carry the encoder
    outputs its first stage received (``encoder_inputs``: ``set_encoder_inputs``'s
    arguments, ``--encoder-schedule separate``), which that chunk then takes for them."""
    def forward_step(data_iterator, chunk):
        host = next(data_iterator)
        received = host.get("encoder_inputs")
        b, mask, layout = prepare_batch(host, chunk, attention, split=False)
        if received is not None:
            get_attr_wrapped_model(chunk, "set_encoder_inputs")(*received)
        logits = chunk(b["tokens"], b["position_ids"], b["media"], attention_mask=mask,
                       layout=layout)  # [B, S, V / TP] at the end
        if received is not None:
            get_attr_wrapped_model(chunk, "set_encoder_inputs")({})

        def argmax_last(output, non_loss_data=True):
            top = gather_from_tensor_model_parallel_region(output[:, last].contiguous()).float()
            top[:, vocab_size:] = -math.inf  # media ids and TP vocab padding are not text
            return top.argmax(-1)
        return logits, argmax_last
    # the schedule executor sizes its pipeline messages by it (runtime/message_specs.py)
    forward_step.whole_sequence = True
    return forward_step


def next_tokens(model: List, micro_batches: List[dict], vocab_size: int,
                attention=None, forward_backward=None, last: int = -1) -> torch.Tensor:
    """Greedy next token of every row of ``micro_batches``, by one forward-only pass through
    the pipeline (the schedule Megatron-Core picks for the layout); all pipeline ranks get
    the result. ``attention`` (AttentionSettings) gives the training mask, whole-sequence:
    with context parallelism every CP rank decodes the whole prompt. ``last``: the position
    whose next token is wanted (the rows' last real token, before padding)."""
    first = micro_batches[0]["tokens"]
    iterators = [iter(micro_batches) for _ in model] if len(model) > 1 else iter(micro_batches)
    collected = (forward_backward or get_forward_backward_func())(
        forward_step_func=greedy_step(vocab_size, attention, last), data_iterator=iterators,
        model=model, num_microbatches=len(micro_batches), seq_length=first.shape[1],
        micro_batch_size=first.shape[0], forward_only=True, collect_non_loss_data=True)
    rows = sum(len(b["tokens"]) for b in micro_batches)
    nxt = (torch.cat(collected) if parallel_state.is_pipeline_last_stage()
           else torch.empty(rows, dtype=torch.long))
    group = parallel_state.get_pipeline_model_parallel_group()
    nxt = nxt.to(collective_device(group))
    torch.distributed.broadcast(nxt, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                                group=group)
    return nxt


def decoding_rows(prompts: List[Sample], pieces: int) -> List[Sample]:
    """The rows one decoding batch runs in ``pieces`` micro-batches (``decoding_pieces``):
    ``prompts`` padded with repeats of the last to a multiple of it."""
    return list(prompts) + [prompts[-1]] * (-len(prompts) % pieces)


def decoding_pieces(model: List) -> int:
    """Interleaved 1F1B runs whole groups of PP equal micro-batches: a decoding batch is
    split in PP with virtual stages, else run whole."""
    return parallel_state.get_pipeline_model_parallel_world_size() if len(model) > 1 else 1


def llm_decoding_pieces(parallel) -> int:
    """``decoding_pieces`` of the LLM's ranks from the parallel flags, on any rank (an
    encoder rank of ``--encoder-schedule separate`` has a grid and one chunk of its own)."""
    vpp = parallel.virtual_pipeline_model_parallel_size or 1
    return parallel.pipeline_model_parallel_size if vpp > 1 else 1


def decoding_micro_batches(rows: List[Sample], pieces: int, pad_id: int,
                           pad_to_multiple_of: int = 1) -> List[dict]:
    size = len(rows) // pieces
    return [collate(rows[i:i + size], pad_id=pad_id, pad_to_multiple_of=pad_to_multiple_of)
            for i in range(0, len(rows), size)]


@torch.no_grad()
def greedy_generate(model: List, prompts: List[Sample], pad_id: int, max_new_tokens: int,
                    eos_id: int, vocab_size: int, attention=None,
                    forward_backward=None, pad_to_multiple_of: int = 1,
                    lockstep: bool = False, encoded=None,
                    lockstep_group=None) -> List[List[int]]:
    """Greedy continuation of prompts of equal length; returns new ids up to EOS. Rows are
    right-padded to a multiple of ``pad_to_multiple_of`` (SP, FP8: ``llm_sequence_multiple``).
    ``lockstep``: every rank of ``lockstep_group`` (default: the world) stops at the same
    step (the last one to finish). ``encoded``:
    per micro-batch the encoder outputs its first stage received (``separate_generation``),
    taken at every step (the media do not change while the answer grows)."""
    pieces = decoding_pieces(model)
    rows = decoding_rows(prompts, pieces)
    out = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_new_tokens):
        micro = decoding_micro_batches(rows, pieces, pad_id, pad_to_multiple_of)
        for batch, received in zip(micro, encoded or ()):
            if received is not None:
                batch["encoder_inputs"] = received
        nxt = next_tokens(model, micro, vocab_size, attention, forward_backward,
                          last=len(rows[0].tokens) - 1).tolist()
        for i, t in enumerate(nxt[:len(prompts)]):
            if not done[i]:
                out[i].append(t)
                done[i] = t == eos_id
        if _all_finished(all(done), lockstep, lockstep_group):
            break
        rows = [_extend(row, t) for row, t in zip(rows, nxt)]
    return [ids[:-1] if ids and ids[-1] == eos_id else ids for ids in out]


def _all_finished(finished: bool, lockstep: bool, group=None) -> bool:
    if not lockstep:
        return finished
    flag = torch.tensor([int(finished)], device=collective_device(group))
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _extend(sample: Sample, token: int) -> Sample:
    """``sample`` with ``token`` appended; M-RoPE positions go on as text (after the
    largest position so far, as transformers' generation continues them)."""
    tail = torch.tensor([token], dtype=sample.tokens.dtype)
    positions = sample.position_ids
    if positions is not None:
        positions = sample_positions(sample, len(sample.tokens) + 1)
    return dataclasses.replace(sample, tokens=torch.cat([sample.tokens, tail]),
                               labels=torch.cat([sample.labels, tail]),
                               loss_mask=torch.cat([sample.loss_mask, torch.zeros(1)]),
                               position_ids=positions)


def normalize_answer(text: str) -> str:
    return " ".join(text.lower().strip().rstrip(".").split())


def decoding_batches(config, dataset, indices: Sequence[int]) -> List[List[Sample]]:
    """The batches greedy decoding runs ``indices`` in: their prompts (the samples cut
    before the answer), those of equal length together, micro-batch-size at a time."""
    prompts = []
    for idx in indices:
        sample = dataset[idx]
        n = sample.prompt_len
        sample.tokens, sample.labels = sample.tokens[:n], sample.labels[:n]
        sample.loss_mask = sample.loss_mask[:n]
        if sample.position_ids is not None:
            sample.position_ids = sample.position_ids[:, :n]
        prompts.append(sample)
    prompts.sort(key=lambda s: len(s.tokens))
    size = config.training.micro_batch_size
    batches = []
    for _, group in itertools.groupby(prompts, key=lambda s: len(s.tokens)):
        group = list(group)
        batches += [group[start:start + size] for start in range(0, len(group), size)]
    return batches


def _decoder(config, model, tokenizer, attention, multiple: int, lockstep: bool,
             shown: Optional[List[ShownAnswer]]):
    """``decode(batch, forward_backward, encoded, lockstep_group)``: greedy decoding of one
    batch of prompts, the number of them answered right; the first
    ``--log-validation-samples`` answers appended to ``shown`` (when given)."""
    def decode(batch, forward_backward=None, encoded=None, lockstep_group=None) -> int:
        generated = greedy_generate(model, batch, tokenizer.pad_id,
                                    config.validation.eval_max_new_tokens, tokenizer.eos_id,
                                    tokenizer.base_vocab_size, attention, forward_backward,
                                    multiple, lockstep, encoded, lockstep_group)
        correct = 0
        for sample, ids in zip(batch, generated):
            answer = tokenizer.detokenize(ids)
            correct += int(normalize_answer(answer) == normalize_answer(sample.answer))
            if shown is not None and len(shown) < config.logging.log_validation_samples:
                shown.append(shown_answer(tokenizer, sample, answer))
        return correct
    return decode


def answer_accuracy(config, model: List, dataset, tokenizer, indices: Sequence[int],
                    forward_backward=None, attention=None,
                    shown: Optional[List[ShownAnswer]] = None) -> float:
    """Share of ``indices`` whose greedy answer equals the reference answer.

    Split over data-parallel ranks; prompts of equal length decode as one batch. With
    expert parallelism the experts' all-to-alls pair each forward with other data-parallel
    ranks' forwards, so every rank decodes every prompt, in lockstep. Under
    ``--encoder-schedule separate`` (``forward_backward`` a ``SeparateRun``) the encoder
    ranks encode every LLM replica's batches once (``separate_generation``) and the LLM's
    ranks decode theirs with what they received, through Megatron-Core's schedule (with
    expert parallelism every replica all of them, in lockstep); an encoder rank returns NaN
    (the accuracy is the LLM's).

    ``shown``: filled with up to ``--log-validation-samples`` decoded samples (every data-
    parallel rank's, the same on each), the questions with the answers and references.
    """
    dp_rank = parallel_state.get_data_parallel_rank()
    dp_size = parallel_state.get_data_parallel_world_size()
    # the LLM's flag, not this rank's grid: an encoder rank of the separate placement has
    # no experts, yet encodes for replicas that decode in lockstep
    lockstep = config.parallel.expert_model_parallel_size > 1
    multiple = llm_sequence_multiple(config.fp8_settings, config.parallel)
    for chunk in model:
        chunk.eval()
    mine_shown: Optional[List[ShownAnswer]] = None if shown is None else []
    decode = _decoder(config, model, tokenizer, attention, multiple, lockstep, mine_shown)
    if isinstance(forward_backward, SeparateRun):
        # the replicas whose experts' all-to-alls pair their forwards (the encoder ranks
        # decode nothing)
        lockstep_group = parallel_state.get_expert_model_parallel_group()
        run = forward_backward
        replicas = run.ranks.sizes.llm_data_parallel_size
        pieces = llm_decoding_pieces(config.parallel)
        shares = [decoding_batches(config, dataset, list(indices)[  # in lockstep every
            slice(None) if lockstep else slice(d, None, replicas)])  # replica decodes all
            for d in range(replicas)]
        rounds = encoder_rounds(
            run, model, shares,
            lambda prompts: decoding_micro_batches(decoding_rows(prompts, pieces), pieces,
                                                   tokenizer.pad_id, multiple),
            lambda prompts: greedy_step(tokenizer.base_vocab_size, attention,
                                        len(prompts[0].tokens) - 1))
        # one batch decoded per round, with the encoder outputs it received
        mine = [] if run.encoder else shares[dp_rank]
        correct = sum(decode(mine[k], None, received, lockstep_group)
                      for k, received in enumerate(rounds) if k < len(mine))
        if run.encoder:
            for chunk in model:
                chunk.train()
            return math.nan
        mine = [s for batch in mine for s in batch]
    else:
        mine = list(indices) if lockstep else list(indices)[dp_rank::dp_size]
        correct = sum(decode(batch, forward_backward)
                      for batch in decoding_batches(config, dataset, mine))
        # the replicas decode at their own pace: the all-reduce below waits for none
        host_barrier()
    for chunk in model:
        chunk.train()
    group = parallel_state.get_data_parallel_group()
    counts = torch.tensor([correct, len(mine)], dtype=torch.float64,
                          device=collective_device(group))
    torch.distributed.all_reduce(counts, group=group)
    if shown is not None:  # every replica's (in lockstep each decoded them all: one's)
        parts = [mine_shown]
        if not lockstep and dp_size > 1:
            parts = [None] * dp_size
            torch.distributed.all_gather_object(parts, mine_shown, group=group)
        shown += [s for part in parts for s in part][:config.logging.log_validation_samples]
    return (counts[0] / counts[1].clamp(min=1)).item()
