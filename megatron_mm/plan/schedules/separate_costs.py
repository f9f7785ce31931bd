"""What the separate placement's program costs, timed by the one time model
(``unit_costs.TimeModel``) on the training chain, as ``encoder_pipeline.schedule_costs``
times coarse / bubble: the LLM's chunks (chunk 0 with the encoders' projectors, as
``separate_placements`` builds it; the DeepStack features beside their outputs), each
encoder whole on an encoder replica at its own TP, its messages with the LLM as the
runtime sends them (``separate.Members``), and the encoder replicas' gradient sum once
their last backward is done (the program has no collective for it:
``separate_iteration_s`` adds it).

An encoder's message is its output whole, with every DeepStack layer's output stacked
after it (``runtime/deepstack_carry.py``); the replica's first rank sends it to each of
the LLM first stage's TP x CP ranks, and the stage's first rank the gradient back to each
of the replica's encoder-TP ranks: each direction's copies leave one rank, their bytes
adding on its link (``TimeModel.fan_out_s``). Under context parallelism each CP rank's
gradient of a trained encoder's message covers its share of the sequence: ``B(g, 0)``
all-reduces it over the CP group before it is sent back
(``SeparateExecutor.encoder_output_grads``), the message's bytes per encoder, inside the
stage's chunk-0 backward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..costs.hardware import Hardware, Interconnect
from ..costs.unit_costs import TimeModel
from ..pipeline.layers import Layer
from ..pipeline.partition import StagePartition
from ..record import Record
from .encoder_pipeline import chain_unit, chunk_deepstack_bytes, split_chain
from .separate import SeparateSchedule
from .simulate import ActionCosts, simulate


@dataclass
class SeparateCosts(Record):
    costs: ActionCosts  # per action; ``encoder_output_p2p_s``: the encoder -> LLM sends
    encoder_allreduce_s: float  # the encoder replicas' gradient sum (0: one replica, frozen)


def separate_costs(chain: Sequence[Layer], llm_partition: StagePartition, hardware: Hardware,
                   *, links: Optional[Interconnect] = None,
                   tensor_model_parallel_size: int = 1, context_parallel_size: int = 1,
                   encoder_tensor_model_parallel_size: int = 1,
                   encoder_data_parallel_size: int = 1) -> SeparateCosts:
    """Per-action seconds of one micro-batch (``chain``'s costs per rank at
    ``tensor_model_parallel_size``, the encoders' layers run at the encoder TP; the LLM's
    TP x CP ranks each receive the encoders' messages)."""
    encoders, llm = split_chain(chain)
    time = TimeModel(hardware, links)
    tp, etp = tensor_model_parallel_size, encoder_tensor_model_parallel_size
    chunks = [llm[s:e] for s, e in llm_partition.chunk_bounds()]
    deepstack = chunk_deepstack_bytes(chain, chunks)
    chunks[0] = chunks[0] + [l for _, layers in encoders for l in layers
                             if l.kind == "projector"]
    per_chunk = [[chain_unit(l, time, tp) for l in c] for c in chunks]
    whole = [[l for l in layers if l.kind.endswith(("_embed", "_layer"))]
             for _, layers in encoders]
    per_encoder = [[chain_unit(l, time, tp, etp) for l in layers] for layers in whole]
    trained = sum(l.params * tp / etp for layers in whole for l in layers if l.trainable)
    # the chain's bytes are per rank at TP: the message is the output whole
    message = [(layers[-1].out_bytes + layers[-1].deepstack_bytes) * tp for layers in whole]
    backward_s = [sum(u.backward_s for u in c) for c in per_chunk]
    backward_s[0] += sum(time.allreduce_s(b, context_parallel_size)
                         for b, layers in zip(message, whole)
                         if any(l.trainable for l in layers))
    costs = ActionCosts(
        forward_s=[sum(u.forward_s for u in c) for c in per_chunk],
        backward_s=backward_s,
        encoder_forward_s=[sum(u.forward_s for u in e) for e in per_encoder],
        encoder_backward_s=[sum(u.backward_s for u in e) for e in per_encoder],
        encoder_output_p2p_s=[time.fan_out_s(b, tp * context_parallel_size)
                              for b in message],
        encoder_grad_p2p_s=[time.fan_out_s(b, etp) for b in message])
    if any(deepstack):
        costs.deepstack_p2p_s = [time.p2p_s(b) for b in deepstack]
    return SeparateCosts(costs, time.replica_allreduce_s(trained, encoder_data_parallel_size)
                         if trained else 0.0)


def separate_iteration_s(schedule: SeparateSchedule, costs: SeparateCosts) -> float:
    """The program's simulated iteration: its replay, and each encoder replica's gradient
    sum after its last action (beside the LLM's cool-down)."""
    sim = simulate(schedule, costs.costs)
    encoder_ranks = range(schedule.encoder_rank(0), schedule.num_ranks)
    done = max((t.end_s for t in sim.timeline if t.rank in encoder_ranks), default=0.0)
    return max(sim.iteration_s, done + costs.encoder_allreduce_s)
