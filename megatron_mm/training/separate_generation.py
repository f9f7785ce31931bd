"""``--encoder-schedule separate``: the encoder outputs the val answer accuracy's greedy
decoding takes. Decoding runs a forward per new token, each LLM replica on its own prompts
until they end; the media of a prompt do not change meanwhile, so the encoder ranks need not
follow it: they encode each decoding batch once, in rounds of the separate program run
forward only (round k: every LLM replica's k-th batch, a replica out of batches repeating
its last, whose result it drops). The LLM's first stage keeps what it received (each
encoder's output and DeepStack features, as ``set_encoder_inputs`` takes them) and decodes
the batch with it at every step, through Megatron-Core's schedule on the LLM's own
pipeline, each replica at its own pace. The round's forward on the LLM's ranks is the
decoding's first step run once more (the program's ``F`` actions need one); the features
of a replica's whole share of the validation prompts are kept until it decodes them."""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from megatron.core import parallel_state
from megatron.core.utils import get_attr_wrapped_model

from ..data import Sample

Received = Tuple[dict, dict]  # set_encoder_inputs's (inputs, kept)


def receive_encoder_outputs(run, model: List, batches: List[List[List[Sample]]],
                            micro_batches: Callable[[List[Sample]], List[dict]],
                            step: Callable[[List[Sample]], Callable]
                            ) -> List[List[Optional[Received]]]:
    """Per decoding batch of this LLM replica (``batches[d]``: replica d's, every replica's
    given on every rank), per micro-batch, what its first stage received (None on the
    other stages); an encoder rank gets []. ``run``: the ``SeparateRun``;
    ``micro_batches(prompts)``: the micro-batches decoding runs ``prompts`` in;
    ``step(prompts)``: the forward step decoding takes for them."""
    replicas = len(batches)
    filler = next((b[0] for b in batches if b), None)
    if filler is None:
        return []
    own = None if run.encoder else parallel_state.get_data_parallel_rank()
    kept: List[List[Optional[Received]]] = []
    for k in range(max(len(b) for b in batches)):
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
        if own is not None and k < len(batches[own]):
            kept.append([captured.get(id(b)) for b in micro[own]])
    return kept


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
