"""The separate placement's processes: which global rank runs which rank of the program
(``plan/schedules/separate.py``), the process groups, and the walk of one rank's actions
with the program's exchanges.

The encoder replicas are the world's first ranks (replica e: ranks ``e * ETP`` up to
``(e + 1) * ETP``; with each encoder on replicas of its own, the vision encoder's first,
then the audio encoder's), the LLM's ranks follow at that rank offset with Megatron-Core's own
grid (``initialize_model_parallel(rank_offset=, local_world_size=)``, order
tp-cp-ep-dp-pp), as Megatron-Bridge's MIMO places its modules. The program's IR rank
``d * PP + r`` is the LLM rank of data-parallel replica d and pipeline stage r (TP and CP
rank 0: the program covers LLM TP = CP = 1 and encoder TP = 1 for now, ``SeparateRanks``
refuses more); IR rank ``D * PP + e`` encoder replica e.

``ProgramWalk`` walks a rank's list as the schedule executor does: before action i its
exchange i (the sends of action i - 1 and the receives the program posts there, one
batch over the world group), then the action with the messages it takes; what an action
computes is the caller's (``step``), so the encoder side and the LLM side share the walk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from ..plan.errors import PlanError
from ..plan.schedules.actions import Action
from ..plan.schedules.p2p import Exchange, message_inputs, p2p_program
from ..plan.schedules.separate import SeparateSchedule, SeparateSizes
from .mailbox import Mailbox, Spec

Key = Tuple[str, int, int]


@dataclass
class SeparateRanks:
    """Global rank <-> the program's IR rank for one world (module docstring)."""

    sizes: SeparateSizes
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    context_parallel_size: int

    def __post_init__(self):
        if (self.tensor_model_parallel_size, self.context_parallel_size,
                self.sizes.encoder_tensor_model_parallel_size) != (1, 1, 1):
            raise PlanError("the separate placement's program covers "
                            "--tensor-model-parallel-size 1, --context-parallel-size 1 and "
                            "--encoder-tensor-model-parallel-size 1 so far")

    def global_rank(self, ir: int) -> int:
        pp, dp = self.pipeline_model_parallel_size, self.sizes.llm_data_parallel_size
        if ir >= dp * pp:  # an encoder replica: its first rank
            return (ir - dp * pp) * self.sizes.encoder_tensor_model_parallel_size
        d, r = divmod(ir, pp)  # Megatron's order tp-cp-ep-dp-pp at TP = CP = 1
        return self.sizes.encoder_ranks + d + dp * r

    def ir_rank(self, rank: int) -> int:
        pp, dp = self.pipeline_model_parallel_size, self.sizes.llm_data_parallel_size
        if rank < self.sizes.encoder_ranks:
            return dp * pp + rank // self.sizes.encoder_tensor_model_parallel_size
        r, d = divmod(rank - self.sizes.encoder_ranks, dp)
        return d * pp + r

    def is_encoder(self, rank: int) -> bool:
        return rank < self.sizes.encoder_ranks

    def replica_sets(self) -> List[Tuple[int, int]]:
        """(first rank, ranks) of each encoder's replicas, in chain order; one set all the
        encoders share unless each has its own."""
        etp, own = (self.sizes.encoder_tensor_model_parallel_size,
                    self.sizes.encoder_data_parallel_sizes)
        if not own:
            return [(0, self.sizes.encoder_ranks)]
        return [(sum(own[:p]) * etp, n * etp) for p, n in enumerate(own)]

    def own_encoder(self, rank: int) -> Optional[int]:
        """The encoder (chain order) encoder rank ``rank`` runs when each encoder has
        replicas of its own; None when they share them (or on an LLM rank)."""
        if not self.sizes.encoder_data_parallel_sizes or not self.is_encoder(rank):
            return None
        return next(p for p, (first, n) in enumerate(self.replica_sets())
                    if first <= rank < first + n)


@dataclass
class SeparateGroups:
    """This process's groups beyond Megatron-Core's (which only the LLM's ranks are in)."""

    encoder_data_parallel_group: Optional[dist.ProcessGroup]  # None on an LLM rank


def initialize_separate_parallel(ranks: SeparateRanks) -> SeparateGroups:
    """Megatron-Core's groups on every rank: the LLM's grid at the encoders' rank offset
    (``initialize_model_parallel(rank_offset=, local_world_size=)``) on the LLM's ranks,
    and on the encoder ranks a grid of their own (TP = the encoder's, PP = CP = 1, DP = the
    encoder replicas; one grid per encoder with replicas of its own, so each encoder's
    gradients are summed over its own replicas), so the model, DDP, the optimizer and
    gradient finalisation run there unchanged on Megatron-Core's groups, as each module of
    Megatron-Bridge's MIMO has its own. Megatron-Core keeps one grid per process: the
    encoders' are made first by every rank (``new_group`` is collective), each kept by its
    encoder ranks and put back after the LLM's (which they are in no group of)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    encoder_ranks = ranks.sizes.encoder_ranks
    etp = ranks.sizes.encoder_tensor_model_parallel_size
    encoders = None
    for first, n in ranks.replica_sets():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=etp,
                                                 rank_offset=first, local_world_size=n)
        if first <= rank < first + n:
            encoders = _grid_state()
        parallel_state.destroy_model_parallel()  # forgets the groups, destroys none
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=ranks.tensor_model_parallel_size,
        pipeline_model_parallel_size=ranks.pipeline_model_parallel_size,
        context_parallel_size=ranks.context_parallel_size,
        rank_offset=encoder_ranks, local_world_size=world - encoder_ranks)
    if encoders is None:  # an LLM rank
        return SeparateGroups(encoder_data_parallel_group=None)
    vars(parallel_state).update(encoders)
    return SeparateGroups(encoder_data_parallel_group=parallel_state.get_data_parallel_group())


def _grid_state() -> Dict[str, object]:
    """Megatron-Core's module-level grid (its groups, ranks and sizes)."""
    return {k: v for k, v in vars(parallel_state).items()
            if k.startswith("_") and k[1:2].isupper()}


class ProgramWalk:
    """One rank's walk of the program (module docstring)."""

    def __init__(self, schedule: SeparateSchedule, ranks: SeparateRanks,
                 spec: Callable[[Key], Optional[Spec]], device: torch.device,
                 actions: Optional[List[List[Action]]] = None,
                 cost: Optional[Callable[[Action], float]] = None):
        self.s, self.ranks, self.spec = schedule, ranks, spec
        self.lists = actions if actions is not None else schedule.ranks
        self.program: List[List[Exchange]] = p2p_program(schedule, self.lists, cost)
        self.ir = ranks.ir_rank(dist.get_rank())
        self.mailbox = Mailbox(dist.group.WORLD, device)
        self.inbox: Dict[Key, Optional[torch.Tensor]] = {}
        self.outbox: Dict[Key, Optional[torch.Tensor]] = {}

    def _exchange(self, i: int) -> None:
        ex = self.program[self.ir][i]
        sends = [(self.ranks.global_rank(t.peer), tuple(t.key), self.outbox.pop(tuple(t.key)),
                  self.spec(tuple(t.key))) for t in ex.sends]
        assert not self.outbox, f"messages the program does not list: {sorted(self.outbox)}"
        recvs = [(self.ranks.global_rank(t.peer), tuple(t.key), self.spec(tuple(t.key)))
                 for t in ex.recvs]
        if sends or recvs:
            self.inbox.update(self.mailbox.exchange(sends, recvs))

    def run(self, step: Callable[[Action, Dict[Key, Optional[torch.Tensor]]],
                                 Dict[Key, Optional[torch.Tensor]]]) -> None:
        """``step(action, inputs) -> {message key: tensor}`` runs each action of this rank
        with the messages it takes and returns those it sends (every message of this
        placement crosses ranks: no producer shares a rank with its consumer)."""
        actions = self.lists[self.ir]
        for i, a in enumerate(actions):
            self._exchange(i)
            inputs = {}
            for key, _ in message_inputs(self.s, a):
                self.mailbox.take(key)
                inputs[key] = self.inbox.pop(key)
            self.outbox.update(step(a, inputs))
        self._exchange(len(actions))
        self.mailbox.finish()
        assert not self.inbox, f"messages received but never used: {sorted(self.inbox)}"
