"""An encoder schedule by its ``--encoder-schedule`` name, for one ``ScheduleProblem``.

What the training run, the standalone executor factory and a Megatron-LM script generate
alike: ``coarse`` (``generate.coarse``), ``bubble`` (``bubble.bubble`` on the costs with the
expert all-to-alls folded into the LLM actions, its full search ``extra_warmup="auto"``, or
``quick``: its two quickest orders, to rank plans), then the expert all-to-alls of an MoE
LLM's chunks (``expert_chunks``) as actions. The separate placement's program is
``separate.separate`` (a world of its own: ``separate_run``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..errors import PlanError
from .actions import Schedule
from .bubble import bubble
from .collectives import add_expert_all_to_alls
from .generate import coarse
from .problem import ScheduleProblem

COLOCATED = ("coarse", "bubble")


def encoder_schedule(name: str, problem: ScheduleProblem, expert_chunks: Sequence[int] = (),
                     quick: bool = False) -> Schedule:
    """The ``name`` schedule of ``problem`` (module docstring)."""
    if name == "coarse":
        schedule = coarse(problem)
    elif name == "bubble":
        folded = replace(problem, costs=problem.costs_for("bubble").all_to_alls_folded())
        schedule = bubble(folded, extra_warmup="quick" if quick else "auto")
    else:
        raise PlanError(f"--encoder-schedule {name!r}: expected one of {list(COLOCATED)} "
                        "(encoder pipelines on the LLM's ranks)")
    return add_expert_all_to_alls(schedule, expert_chunks)
