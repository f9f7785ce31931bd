"""Schedule generators producing ``actions.Schedule``.

- ``megatron``: Megatron-Core's 1F1B (VPP = 1) or interleaved 1F1B order, the encoder
  inside LLM chunk 0 on the first stage (the baseline);
- ``coarse``: the encoder as its own pipeline over ``encoder_stages`` ranks, every encoder
  forward before the LLM's work and every encoder backward after it (Optimus' coarse
  baseline).

Optimus' ``bubble`` schedule, which moves encoder pieces into the LLM's bubbles, is in
``bubble.py``. Every generator places the collectives its settings call for
(``collectives.add_collectives``: ``encoder_replicas``, ``grad_sync``) and validates what it
returns (``actions.validated``). Each takes one ``problem.ScheduleProblem``.
"""

from __future__ import annotations

from typing import List

from ..errors import PlanError
from .actions import Action, Kind, Schedule, validated
from .collectives import add_collectives
from .problem import EncoderLayout, ScheduleProblem, encoder_placement

__all__ = ["EncoderLayout", "ScheduleProblem", "coarse", "encoder_placement", "llm_order",
           "megatron"]


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


@validated
def coarse(problem: ScheduleProblem) -> Schedule:
    """Every encoder forward first, then the LLM, then every encoder backward."""
    schedule = problem.empty_schedule("coarse")
    pp, vpp, m = problem.pp, problem.vpp, problem.num_microbatches
    for r in range(pp):
        mine = [s for s, rank in enumerate(schedule.encoder_ranks) if rank == r]
        before = [Action(Kind.EF, mb, s) for mb in range(m) for s in mine]
        after = [Action(Kind.EB, mb, s) for mb in range(m)
                 for s in reversed(mine) if schedule.encoder_backward(s)]
        schedule.ranks.append(before + llm_order(pp, vpp, m, r) + after)
    return add_collectives(schedule, problem.encoder_replicas, problem.grad_sync,
                           problem.encoder_grad_sync)
