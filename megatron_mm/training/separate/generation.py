"""``--encoder-schedule separate``: the encoder outputs the val answer accuracy's greedy
decoding takes. Decoding runs a forward per new token, each LLM replica on its own prompts
until they end; the media of a prompt do not change meanwhile, so the encoder ranks need not
follow it: they encode each decoding batch once, in rounds of the separate program run
forward only (round k: every LLM replica's k-th batch, a replica out of batches repeating
its last, whose result it drops). The LLM's first stage keeps what it received for the
round's batch (each encoder's output and DeepStack features, as ``set_encoder_inputs``
takes them) and decodes the batch with it at every step, through Megatron-Core's schedule
on the LLM's own pipeline; the round's forward on the LLM's ranks is the decoding's first
step run once more (the program's ``F`` actions need one).

Between rounds every rank of the world waits on the host (``host_barrier``) for the
replicas to finish decoding: an encoder rank that posted the next round's (or the next
step's) exchange instead, or a replica its next collective, would hold a NCCL Work open
across a whole decode, which NCCL's watchdog aborts past ``--distributed-timeout-minutes``;
and only one batch's encoder outputs are held at a time."""

from __future__ import annotations

from typing import Callable, Iterator, List, Optional, Tuple

from megatron.core import parallel_state
from megatron.core.utils import get_attr_wrapped_model

from ...data import Sample
from ...runtime.host_barrier import host_barrier

Received = Tuple[dict, dict]  # set_encoder_inputs's (inputs, kept)


def encoder_rounds(run, model: List, batches: List[List[List[Sample]]],
                   micro_batches: Callable[[List[Sample]], List[dict]],
                   step: Callable[[List[Sample]], Callable]
                   ) -> Iterator[Optional[List[Optional[Received]]]]:
    """One item per round k: on an LLM rank, per micro-batch of its replica's k-th decoding
    batch (``batches[d]``: replica d's, every replica's given on every rank) what its first
    stage received (None on the other stages), or None when the replica has no k-th batch;
    None on an encoder rank. The caller decodes the batch before asking for the next
    round, which starts once every rank of the world is back (``host_barrier``); no round
    without a batch. ``run``: the ``SeparateRun``; ``micro_batches(prompts)``: the
    micro-batches decoding runs ``prompts`` in; ``step(prompts)``: its forward step."""
    replicas = len(batches)
    filler = next((b[0] for b in batches if b), None)
    if filler is None:
        return
    own = None if run.encoder else parallel_state.get_data_parallel_rank()
    for k in range(max(len(b) for b in batches)):
        if k:
            host_barrier()  # every replica done decoding round k - 1
        chosen = [b[min(k, len(b) - 1)] if b else filler for b in batches]
        micro = [micro_batches(prompts) for prompts in chosen]
        m = len(micro[0])  # the same for every replica (PP with virtual stages, else 1)
        # the program's micro-batch order (SeparateRun): an encoder rank reads every
        # replica's in turn, an LLM rank its own
        order = ([micro[d][i] for i in range(m) for d in range(replicas)] if own is None
                 else micro[own])
        captured = {}
        run(forward_step_func=_capturing(step(chosen[own]) if own is not None else None,
                                         captured),
            data_iterator=iter(order), model=model, num_microbatches=m,
            forward_only=True, collect_non_loss_data=True)
        mine = own is not None and k < len(batches[own])
        yield [captured.pop(id(b), None) for b in micro[own]] if mine else None
        del captured, order, micro
    host_barrier()  # the last round's decoding: no rank's next collective waits on it


def _capturing(step, captured: dict):
    """``step``, keeping (by micro-batch) the encoder outputs the schedule executor set on
    the chunk before it (``set_encoder_inputs``; only the LLM's first stage gets any)."""
    def forward_step(data_iterator, chunk):
        batch = next(data_iterator)
        inputs = get_attr_wrapped_model(chunk, "encoder_inputs")
        if inputs:
            captured[id(batch)] = (dict(inputs),
                                   dict(get_attr_wrapped_model(chunk, "encoder_kept")))
        return step(iter([batch]), chunk)
    forward_step.whole_sequence = True
    return forward_step
