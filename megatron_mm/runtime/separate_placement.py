"""The separate placement's processes: which global rank runs which rank of the program
(``plan/schedules/separate.py``), the process groups, and the walk of one rank's actions
with the program's exchanges.

The encoder replicas are the world's first ranks (replica e: ranks ``e * ETP`` up to
``(e + 1) * ETP``; with each encoder on replicas of its own, the vision encoder's first,
then the audio encoder's), the LLM's ranks follow at that rank offset with Megatron-Core's own
grid (``initialize_model_parallel(rank_offset=, local_world_size=)``, order
tp-cp-ep-dp-pp), as Megatron-Bridge's MIMO places its modules. The program's IR rank
``d * PP + r`` is run by the TP x CP ranks of the LLM's data-parallel replica d and pipeline
stage r, IR rank ``D * PP + e`` by encoder replica e's ETP ranks (``separate.Members``:
an encoder output goes from the replica's first rank to each of the stage's ranks, its
gradient from the stage's first rank to each of the replica's).

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

from ..plan.schedules.actions import Action
from ..plan.schedules.p2p import Exchange, message_inputs, p2p_program
from ..plan.schedules.separate import Members, SeparateSchedule, SeparateSizes, check_members
from .mailbox import Mailbox, Spec

Key = Tuple[str, int, int]


@dataclass
class SeparateRanks:
    """Global rank <-> (the program's IR rank, member) for one world (module docstring;
    ``Members``: the processes that run one IR rank, member 0 its lead)."""

    sizes: SeparateSizes
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    context_parallel_size: int
    # an MoE LLM's experts: Megatron-Core's expert grid over the LLM's ranks only
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: Optional[int] = None  # None: the LLM's TP
    lockstep_replicas: int = 1  # ``Members.lockstep_replicas``

    @property
    def members(self) -> Members:
        return Members(llm=self.tensor_model_parallel_size * self.context_parallel_size,
                       encoder=self.sizes.encoder_tensor_model_parallel_size,
                       llm_ranks=self.sizes.llm_data_parallel_size
                       * self.pipeline_model_parallel_size,
                       llm_stages=self.pipeline_model_parallel_size,
                       lockstep_replicas=self.lockstep_replicas)

    def global_rank(self, ir: int, member: int = 0) -> int:
        pp, dp = self.pipeline_model_parallel_size, self.sizes.llm_data_parallel_size
        if ir >= dp * pp:  # an encoder replica: its ETP ranks
            return (ir - dp * pp) * self.sizes.encoder_tensor_model_parallel_size + member
        d, r = divmod(ir, pp)  # Megatron's order tp-cp-ep-dp-pp: member = tp + TP * cp
        return self.sizes.encoder_ranks + member + self.members.llm * (d + dp * r)

    def ir_rank(self, rank: int) -> int:
        return self.ir_member(rank)[0]

    def ir_member(self, rank: int) -> Tuple[int, int]:
        pp, dp = self.pipeline_model_parallel_size, self.sizes.llm_data_parallel_size
        if rank < self.sizes.encoder_ranks:
            e, k = divmod(rank, self.sizes.encoder_tensor_model_parallel_size)
            return dp * pp + e, k
        grid, k = divmod(rank - self.sizes.encoder_ranks, self.members.llm)
        r, d = divmod(grid, dp)
        return d * pp + r, k

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


def initialize_separate_parallel(ranks: SeparateRanks,
                                 virtual_pipeline_model_parallel_size: Optional[int] = None
                                 ) -> SeparateGroups:
    """Megatron-Core's groups on every rank: the LLM's grid at the encoders' rank offset
    (``initialize_model_parallel(rank_offset=, local_world_size=)``, its experts' grid with
it) on the LLM's ranks,
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
        _forget_grid()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=ranks.tensor_model_parallel_size,
        pipeline_model_parallel_size=ranks.pipeline_model_parallel_size,
        context_parallel_size=ranks.context_parallel_size,
        # the LLM's model chunks per rank (interleaved 1F1B); the encoders' grid has none
        virtual_pipeline_model_parallel_size=virtual_pipeline_model_parallel_size,
        # the experts' grid (ETP x EP x expert DP x PP) over the LLM's ranks too: the
        # all-to-alls and the experts' gradient reduction never reach an encoder rank
        expert_model_parallel_size=ranks.expert_model_parallel_size,
        expert_tensor_parallel_size=ranks.expert_tensor_parallel_size,
        rank_offset=encoder_ranks, local_world_size=world - encoder_ranks)
    if encoders is None:  # an LLM rank
        return SeparateGroups(encoder_data_parallel_group=None)
    vars(parallel_state).update(encoders)
    return SeparateGroups(encoder_data_parallel_group=parallel_state.get_data_parallel_group())


def _forget_grid() -> None:
    """Megatron-Core's ``destroy_model_parallel`` without destroying a group: it forgets
    every group but destroys the gloo ones (``_DATA_PARALLEL_GROUP_GLOO`` and the
    experts'), which an encoder rank puts back and its distributed optimizer uses as
    ``data_parallel_group_gloo``; forgotten first, they stay live."""
    for name in _grid_state():
        if name.endswith("_GLOO"):
            setattr(parallel_state, name, None)
    parallel_state.destroy_model_parallel()


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
        check_members(schedule, self.lists, self.program, ranks.members)
        self.ir, self.member = ranks.ir_member(dist.get_rank())
        self.mailbox = Mailbox(dist.group.WORLD, device)
        self.inbox: Dict[Key, Optional[torch.Tensor]] = {}
        self.outbox: Dict[Key, Optional[torch.Tensor]] = {}

    def _exchange(self, i: int) -> None:
        ex = self.program[self.ir][i]
        sends = []
        for t in ex.sends:
            key = tuple(t.key)
            tensor = self.outbox.pop(key)
            sends += [(self.ranks.global_rank(p, j), key, tensor, self.spec(key))
                      for p, j in self.ranks.members.targets(self.ir, self.member, t.peer)]
        assert not self.outbox, f"messages the program does not list: {sorted(self.outbox)}"
        recvs = [(self.ranks.global_rank(*self.ranks.members.source(
            self.ir, self.member, t.peer)), tuple(t.key), self.spec(tuple(t.key)))
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
