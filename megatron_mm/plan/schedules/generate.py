"""Schedule generators producing ``actions.Schedule``.

- ``megatron``: Megatron-Core's 1F1B (VPP = 1) or interleaved 1F1B order, the encoder
  inside LLM chunk 0 on the first stage (the baseline);
- ``coarse``: the encoder as its own pipeline over ``encoder_stages`` ranks, every encoder
  forward before the LLM's work and every encoder backward after it (Optimus' coarse
  baseline).

Optimus' ``bubble`` schedule, which moves encoder pieces into the LLM's bubbles, is in
``bubble.py``. Every generator places the collectives its settings call for
(``collectives.add_collectives``: ``encoder_replicas``, ``grad_sync``) and validates what it
returns (``actions.validated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..errors import PlanError
from ..record import Record
from .actions import Action, Kind, Schedule, validated
from .collectives import add_collectives


@dataclass
class EncoderLayout(Record):
    """One encoder's own pipeline layout (``encoder_placement``): its stages, the pieces
    each stage is cut into, and whether it is placed from the last rank."""

    encoder_pipeline_model_parallel_size: int
    pieces: int = 1
    reverse: bool = False
    virtual: int = 1  # --encoder-virtual-pipeline-model-parallel-size

    def ranks(self, pp: int) -> List[int]:
        return encoder_placement(pp, self.encoder_pipeline_model_parallel_size, self.pieces,
                                 self.reverse, self.virtual)[1]


def llm_order(pp: int, vpp: int, m: int, rank: int, extra_warmup: int = 0) -> List[Action]:
    """Megatron-Core's forward/backward order on ``rank`` (schedules.py: warm-up forwards,
    1F1B steady state, cool-down backwards; chunk and micro-batch of the k-th forward or
    backward as ``get_model_chunk_id`` / ``get_microbatch_id_in_model_chunk`` compute).
    ``extra_warmup`` more forwards before the first backward keep that many more
    micro-batches' activations in flight and leave the rank room for other work."""
    if vpp > 1 and m % pp:
        raise PlanError(f"interleaved 1F1B needs the micro-batches ({m}) to be a multiple "
                        f"of --pipeline-model-parallel-size ({pp})")
    total = m * vpp
    if vpp == 1:
        warmup = min(pp - rank - 1 + extra_warmup, total)
    else:
        warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp + extra_warmup, total)

    def unit(k: int, forward: bool) -> Action:
        group = k % (pp * vpp)
        v = group // pp
        if not forward:
            v = vpp - 1 - v
        mb = (k // (pp * vpp)) * pp + k % pp if vpp > 1 else k
        return Action(Kind.F if forward else Kind.B, mb, v * pp + rank)

    order = [unit(k, True) for k in range(warmup)]
    for i in range(total - warmup):
        order.append(unit(warmup + i, True))
        order.append(unit(i, False))
    order += [unit(i, False) for i in range(total - warmup, total)]
    return order


@validated
def megatron(pp: int, vpp: int, num_microbatches: int, grad_sync: bool = False) -> Schedule:
    return add_collectives(Schedule(
        name="megatron", pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp, num_microbatches=num_microbatches,
        ranks=[llm_order(pp, vpp, num_microbatches, r) for r in range(pp)]),
        grad_sync=grad_sync)


def encoder_placement(pp: int, encoder_stages: Optional[int] = None, pieces: int = 1,
                      reverse: bool = False, virtual: int = 1) -> Tuple[int, List[int]]:
    """(encoder stages, the rank of each encoder piece): stage s on rank s * (PP / stages)
    (``reverse``: counted from the last rank, so the encoder ends on the rank the LLM
    starts on), cut into ``pieces`` consecutive pieces there; encoder PP must divide LLM
    PP. ``virtual`` > 1 (``--encoder-virtual-pipeline-model-parallel-size``) interleaves
    the encoder as Megatron-Core interleaves the LLM: its layers run ``virtual`` times
    over the stages, each rank holding ``virtual`` ranges of them, so the first
    micro-batch's first piece (which every other rank waits for) and the last one's
    backward (which ends the iteration) are ``virtual`` times shorter."""
    stages = encoder_stages or pp
    if stages < 1 or pp % stages:
        raise PlanError(f"--encoder-pipeline-model-parallel-size ({stages}) must divide "
                        f"--pipeline-model-parallel-size ({pp})")
    if pieces < 1:
        raise PlanError(f"--encoder-pieces must be at least 1 (got {pieces})")
    if virtual < 1 or (virtual > 1 and stages < 2):
        raise PlanError(f"--encoder-virtual-pipeline-model-parallel-size ({virtual}) needs "
                        "an encoder pipeline of at least 2 stages "
                        f"(--encoder-pipeline-model-parallel-size is {stages})"
                        if virtual > 1 else
                        f"--encoder-virtual-pipeline-model-parallel-size must be at least 1 "
                        f"(got {virtual})")
    ranks = [((p // pieces) % stages) * (pp // stages) for p in range(virtual * stages * pieces)]
    return stages, [pp - 1 - r for r in ranks] if reverse else ranks


def separate_encoders(name: str, pp: int, vpp: int, num_microbatches: int,
                      encoder_trainable: bool, encoder_stages: Optional[int] = None,
                      pieces: int = 1, reverse: bool = False, encoders: int = 1,
                      frozen_encoders: Sequence[int] = (),
                      layouts: Optional[Sequence[EncoderLayout]] = None) -> Schedule:
    """An empty schedule (no actions yet, no collectives: ``add_collectives`` places them
    once the compute is ordered) whose ``encoders`` encoders each run as their own
    pipeline, all with the same layout (``encoder_placement``), or each with its own
    (``layouts``, one per encoder: a small audio encoder on fewer ranks, say), their pieces
    numbered one encoder after the other; ``frozen_encoders`` have no backward."""
    if layouts is None:
        if encoders < 1:
            raise PlanError(f"a schedule with separate encoders needs at least one (got "
                            f"{encoders})")
        layouts = [EncoderLayout(encoder_placement(pp, encoder_stages)[0], pieces, reverse)
                   ] * encoders
    elif not layouts:
        raise PlanError("a schedule with separate encoders needs at least one layout")
    per_encoder = [layout.ranks(pp) for layout in layouts]
    ranks = [r for mine in per_encoder for r in mine]
    return Schedule(name=name, pipeline_model_parallel_size=pp,
                    virtual_pipeline_model_parallel_size=vpp,
                    num_microbatches=num_microbatches, encoder_stages=len(ranks),
                    encoder_trainable=encoder_trainable, encoder_ranks=ranks,
                    encoder_pieces=[len(m) for m in per_encoder] if len(layouts) > 1 else [],
                    frozen_encoders=sorted(frozen_encoders))


@validated
def coarse(pp: int, vpp: int, num_microbatches: int, encoder_trainable: bool,
           encoder_stages: Optional[int] = None, pieces: int = 1,
           reverse: bool = False, encoders: int = 1,
           frozen_encoders: Sequence[int] = (), encoder_replicas: int = 1,
           grad_sync: bool = False, encoder_grad_sync: bool = False,
           layouts: Optional[Sequence[EncoderLayout]] = None) -> Schedule:
    """Every encoder forward first, then the LLM, then every encoder backward."""
    schedule = separate_encoders("coarse", pp, vpp, num_microbatches, encoder_trainable,
                                 encoder_stages, pieces, reverse, encoders, frozen_encoders,
                                 layouts)
    for r in range(pp):
        mine = [s for s, rank in enumerate(schedule.encoder_ranks) if rank == r]
        before = [Action(Kind.EF, mb, s) for mb in range(num_microbatches) for s in mine]
        after = [Action(Kind.EB, mb, s) for mb in range(num_microbatches)
                 for s in reversed(mine) if schedule.encoder_backward(s)]
        schedule.ranks.append(before + llm_order(pp, vpp, num_microbatches, r) + after)
    return add_collectives(schedule, encoder_replicas, grad_sync, encoder_grad_sync)
