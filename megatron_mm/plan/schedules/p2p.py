"""The point-to-point messages of a schedule, grouped into exchanges NCCL cannot deadlock.

Every rank walks its own action list. Before action i it makes one exchange: the sends
that action i - 1 produced and receives go out together (one ``batch_isend_irecv``, as
Megatron-Core's p2p does), and the rank waits for its receives. NCCL runs a rank's
exchanges one after another and completes a send only once its receive is posted, so a
receive posted just before its consumer can leave a peer's stream stuck behind a send
(the send/send cycle of an encoder output sent long before it is needed). Receives are
therefore posted by time: in the receiver's exchange that coincides with the send on the
schedule's timeline, which orders all exchanges consistently (``p2p_program``). NCCL
matches a pair of ranks' messages by order, not by tag: both sides use the sender's order,
and a message received before its action waits there (an encoder piece's output may come
before an LLM activation the receiver needs first).

``check_rendezvous`` replays exchanges as NCCL runs them and names the blocked messages
of an ordering that would hang. Messages between actions on the same rank stay local and
are not listed.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import PlanError
from ..record import Record
from .actions import Action, Schedule
from .encoder_pipeline import encoder_replica_of

Key = Tuple[str, int, int]  # (kind, micro-batch, chunk or encoder piece)


def output_grad_key(m: int, piece: int) -> Key:
    """The message of ``B(m, 0)``'s gradient for encoder piece ``piece``'s output (an
    encoder's last piece): negative, so no LLM chunk's gradient is it."""
    return ("B", m, -1 - piece)


def forward_key(key: Key) -> Key:
    """The forward message a gradient message is the gradient of (itself for a forward
    message): the receiver of either knows its shape from the forward's."""
    kind, m, c = key
    if kind == "B":
        return ("EF", m, -1 - c) if c < 0 else ("F", m, c - 1)
    if kind == "EB":
        return ("EF", m, c - 1)
    return key


def message_inputs(s: Schedule, a: Action) -> List[Tuple[Key, Action]]:
    """The messages action ``a`` takes, each with the action that produces it, in the
    order the action uses them."""
    m, c = a.microbatch, a.chunk
    if a.kind == "F":
        if c > 0:
            return [(("F", m, c - 1), Action("F", m, c - 1))]
        if s.encoder_replicas > 1:  # the encoder outputs arrive through BCAST (local)
            return []
        return [(("EF", m, end - 1), Action("EF", m, end - 1)) for _, end in s.encoder_spans()]
    if a.kind == "BCAST":  # the owner replica receives encoder piece c's output
        return [(("EF", m, c), Action("EF", m, c))]
    if a.kind in ("ALLREDUCE", "GRAD_SYNC", "ENCODER_GRAD_SYNC", "A2A", "A2A_B"):
        return []
    if a.kind == "B":
        if c == s.num_chunks - 1:
            return []
        return [(("B", m, c + 1), Action("B", m, c + 1))]
    first, end = s.encoder_span(c)
    if a.kind == "EF":
        return [(("EF", m, c - 1), Action("EF", m, c - 1))] if c > first else []
    if c == end - 1:  # EB of an encoder's last piece: the gradient of its output
        return [(output_grad_key(m, c), Action("B", m, 0))]
    return [(("EB", m, c + 1), Action("EB", m, c + 1))]


@dataclass
class Transfer(Record):
    peer: int  # pipeline rank sent to / received from
    key: List  # the message (kind, micro-batch, chunk or piece)


@dataclass
class Exchange(Record):
    """One point of a rank's schedule: what goes out and comes in together."""

    sends: List[Transfer] = field(default_factory=list)
    recvs: List[Transfer] = field(default_factory=list)


Cost = Callable[[Action], float]


def unit_cost(a: Action) -> float:
    """Seconds of an action when nothing better is known: a backward twice its forward
    (the expert all-to-alls, inside the LLM action before them, nothing more)."""
    if a.kind in ("A2A", "A2A_B"):
        return 0.0
    return 2.0 if a.kind in ("B", "EB") else 1.0


def p2p_program(s: Schedule, ranks: Sequence[Sequence[Action]],
                cost: Optional[Cost] = None, late: bool = False) -> List[List[Exchange]]:
    """Per rank, ``len(actions) + 1`` exchanges: exchange i runs before action i (the
    last one after the last action) for the action lists ``ranks`` (the schedule's, or
    the subset an iteration runs: forwards only, one encoder replica's micro-batches).
    A message exists when its producer and consumer both run, on different ranks; it is
    sent in the exchange right after its producer.

    Its receive goes into the receiver's first exchange that starts once the producer
    finishes, on the timeline of ``cost`` (seconds per action, ``unit_cost`` by default;
    buffered sends): both sides then post it at about the same time, so neither stream
    waits long for the other. Ordering every rank's exchanges by the time of their messages
    this way cannot deadlock: each exchange holds the messages of the interval between
    two of its rank's action starts, so the messages complete in time order. ``late``
    instead posts each receive just before its consumer (in the peer's send order):
    what NCCL can hang on (``check_rendezvous`` says where)."""
    where: Dict[Key, Tuple[int, int]] = {}  # action key -> (rank, index)
    for r, actions in enumerate(ranks):
        for i, a in enumerate(actions):
            where[a.key] = (r, i)
    sent: List[Tuple[int, int, int, Key]] = []  # (src, index, dst, key)
    for r, actions in enumerate(ranks):
        for a in actions:
            for key, producer in message_inputs(s, a):
                src, j = where.get(producer.key, (r, -1))
                if src != r:
                    sent.append((src, j, r, key))
    program = [[Exchange() for _ in range(len(actions) + 1)] for actions in ranks]
    # A rank sends in action order, one action's messages by (receiver, key): every rank
    # computes the same order, and receives each peer's messages in it.
    for src, j, dst, key in sorted(sent):
        program[src][j + 1].sends.append(Transfer(dst, list(key)))
    if late:
        _post_late(s, ranks, where, sorted(sent), program)
        return program
    start, finish = _timeline(s, ranks, where, cost or unit_cost)
    for src, j, dst, key in sorted(sent, key=lambda t: (finish[t[0]][t[1]],) + t):
        k = bisect.bisect_left(start[dst], finish[src][j])  # first start at or after it
        program[dst][k].recvs.append(Transfer(src, list(key)))
    check_rendezvous(program)
    return program


def _timeline(s: Schedule, ranks, where, cost: Cost):
    """(start, finish) per rank and action, each rank in its order, an action once its
    inputs are finished (and those of the ranks it walks with, ``Schedule.walks_with``:
    they start it together)."""
    start = [[0.0] * len(actions) for actions in ranks]
    finish = [[0.0] * len(actions) for actions in ranks]
    at, clock = [0] * len(ranks), [0.0] * len(ranks)

    def ready(r: int) -> Optional[float]:
        a = ranks[r][at[r]]
        inputs = [where[p.key] for _, p in message_inputs(s, a) if p.key in where]
        inputs += [where[k] for k in s.control_inputs(a) if k in where]
        if any(q != r and j >= at[q] for q, j in inputs):
            return None
        return max([clock[r]] + [finish[q][j] for q, j in inputs])

    while any(at[r] < len(actions) for r, actions in enumerate(ranks)):
        progressed = False
        for r, actions in enumerate(ranks):
            while at[r] < len(actions):
                group = s.walks_with(r)
                if any(at[q] != at[r] for q in group):
                    break
                times = [ready(q) for q in group]
                if None in times:
                    break
                t = max(times)
                for q in group:
                    start[q][at[q]] = t
                    clock[q] = finish[q][at[q]] = t + max(cost(ranks[q][at[q]]), 1e-9)
                    at[q] += 1
                progressed = True
        if not progressed:
            raise PlanError("the schedule deadlocks: no rank can start its next action")
    # the exchange after a rank's last action: after everything
    return [st + [math.inf] for st in start], finish


def _post_late(s: Schedule, ranks, where, sent, program) -> None:
    channel: Dict[Tuple[int, int], List[Key]] = {}  # (src, dst) -> messages in send order
    for src, _, dst, key in sent:
        channel.setdefault((src, dst), []).append(key)
    for r, actions in enumerate(ranks):
        posted: Dict[int, int] = {}  # per source: how many of its messages are posted
        for i, a in enumerate(actions):
            for key, producer in message_inputs(s, a):
                src = where.get(producer.key, (r,))[0]
                if src == r:
                    continue
                queue = channel[(src, r)]
                stop = queue.index(key) + 1
                for k in queue[posted.get(src, 0):stop]:
                    program[r][i].recvs.append(Transfer(src, list(k)))
                posted[src] = max(posted.get(src, 0), stop)


def check_rendezvous(program: List[List[Exchange]]) -> None:
    """Raise ``PlanError`` if the exchanges can hang when a send completes only once its
    receive is posted (NCCL; gloo under ``MEGATRON_MM_STRICT_P2P=1``) and a rank posts
    exchange i + 1 only once every message of exchange i is matched."""
    _Replay(program).run()


class _Replay:
    """The exchanges as NCCL runs them. The system is monotone (a posted message stays
    posted, a matched one matched), so one replay decides whether every order finishes."""

    def __init__(self, program: List[List[Exchange]]):
        self.program = program
        self.at = [0] * len(program)  # the exchange each rank has posted
        self.posted: Dict[Tuple[str, int, int], int] = {}  # (send|recv, src, dst) -> count
        self.ops: List[List[Tuple[str, int, int, int, Key]]] = [[] for _ in program]
        for r in range(len(program)):
            self.post(r)

    def post(self, r: int) -> None:
        """Post rank r's exchange ``at[r]``: (what, src, dst, position on the channel)."""
        self.ops[r] = []
        if self.at[r] == len(self.program[r]):
            return
        ex = self.program[r][self.at[r]]
        for what, transfers in (("send", ex.sends), ("recv", ex.recvs)):
            for t in transfers:
                self.add(r, what, t)

    def add(self, r: int, what: str, t: Transfer) -> None:
        src, dst = (r, t.peer) if what == "send" else (t.peer, r)
        ch = (what, src, dst)
        self.ops[r].append((what, src, dst, self.posted.get(ch, 0), tuple(t.key)))
        self.posted[ch] = self.posted.get(ch, 0) + 1

    def matched(self, op) -> bool:
        what, src, dst, n, _ = op
        return self.posted.get(("recv" if what == "send" else "send", src, dst), 0) > n

    def run(self) -> None:
        """Replay to the end, or raise ``PlanError`` naming what waits."""
        while True:
            progressed = False
            for r in range(len(self.program)):
                while (self.at[r] < len(self.program[r])
                       and all(self.matched(op) for op in self.ops[r])):
                    progressed = True
                    self.at[r] += 1
                    self.post(r)
            if all(self.at[r] == len(self.program[r]) for r in range(len(self.program))):
                return
            if not progressed:
                raise PlanError(self.deadlock())

    def deadlock(self) -> str:
        return ("the pipeline's point-to-point exchanges deadlock when a send waits for "
                "its receive (as NCCL's do): " + "; ".join(
                    f"rank {r} in exchange {self.at[r]} waits for the "
                    + ", ".join(f"{what} of {key} {'to' if what == 'send' else 'from'} "
                                f"rank {dst if what == 'send' else src}"
                                for what, src, dst, _, key in self.ops[r]
                                if not self.matched((what, src, dst, _, key)))
                    for r in range(len(self.program)) if self.at[r] < len(self.program[r])))


def check_group_rendezvous(programs: List[List[Exchange]],
                           actions: Sequence[Sequence[Action]], groups: Sequence[Sequence[int]],
                           collective: Callable[[Action], bool]) -> None:
    """Raise ``PlanError`` if ranks that also meet in collectives can hang: rank n runs
    exchange 0, action 0, exchange 1, ... of ``programs[n]`` / ``actions[n]`` (exchanges as
    ``check_rendezvous`` replays them), and an action with ``collective(action)`` ends only
    once every rank of ``groups[n]`` (ranks walking the same list) has come to it (their
    TP / CP collectives inside it)."""
    replay = _Replay(programs)  # posts every exchange 0
    n = len(programs)
    in_action = [False] * n
    finished = lambda r: replay.at[r] == len(programs[r])  # noqa: E731
    while not all(finished(r) for r in range(n)):
        progressed = False
        for r in range(n):
            if (not finished(r) and not in_action[r]
                    and all(replay.matched(op) for op in replay.ops[r])):
                progressed = True
                if replay.at[r] == len(actions[r]):  # the exchange after the last action
                    replay.at[r] += 1
                    replay.ops[r] = []
                    continue
                in_action[r] = True
            if in_action[r]:
                group = groups[r] if collective(actions[r][replay.at[r]]) else [r]
                if all(in_action[k] and replay.at[k] == replay.at[r] for k in group):
                    for k in group:
                        in_action[k] = False
                        replay.at[k] += 1
                        replay.post(k)
                    progressed = True
        if not progressed:
            raise PlanError(
                "ranks deadlock: their point-to-point exchanges and the collectives inside "
                "their actions wait on each other (" + "; ".join(
                    f"rank {r} " + (f"in {actions[r][replay.at[r]]}" if in_action[r]
                                    else f"in exchange {replay.at[r]}")
                    for r in range(n) if not finished(r)) + ")")


def carried_by(key: Key, replica: int, replicas: int) -> bool:
    """Whether message ``key`` travels in encoder replica ``replica``'s pipeline group:
    every LLM message, and the encoder messages (pieces' outputs and gradients, ``B(m,
    0)``'s gradient for them) of the micro-batches it owns (``encoder_replica_of``)."""
    kind, m, c = key
    encoder = kind in ("EF", "EB") or (kind == "B" and c < 0)
    return not encoder or replicas == 1 or encoder_replica_of(m, replicas) == replica


def replica_program(program: List[List[Exchange]], replica: int, replicas: int
                    ) -> List[List[Exchange]]:
    """``program`` as encoder replica ``replica`` runs it: the same exchange points, the
    other replicas' encoder messages left out on both sides."""
    keep = lambda t: carried_by(tuple(t.key), replica, replicas)  # noqa: E731
    return [[Exchange([t for t in ex.sends if keep(t)], [t for t in ex.recvs if keep(t)])
             for ex in rank] for rank in program]


def check_replicas(s: Schedule, ranks: Sequence[Sequence[Action]],
                   program: List[List[Exchange]]) -> None:
    """With encoder replicas, check that every replica running ``program`` (the schedule's
    whole action lists ``ranks``, another replica's encoder actions skipped in place) meets
    the others in the LLM's TP collectives without a hang."""
    if s.encoder_replicas > 1:
        n = s.encoder_replicas
        check_replica_rendezvous(s, [replica_program(program, j, n) for j in range(n)],
                                 [ranks] * n)


def check_replica_rendezvous(s: Schedule, programs: Sequence[List[List[Exchange]]],
                             actions: Sequence[Sequence[Sequence[Action]]]) -> None:
    """Raise ``PlanError`` if encoder replicas (``s.encoder_replicas`` > 1) can hang: each
    replica j is one pipeline group running ``actions[j]`` with ``programs[j]``, and the
    ranks of one stage meet in every LLM action (its TP collectives), ``BCAST`` and
    ``ALLREDUCE``, so a
    replica stuck on a pipeline message holds up the others' collective there."""
    _ReplicaReplay(s, programs, actions).run()


class _ReplicaReplay:
    """Per (replica, rank): exchange 0, action 0, exchange 1, ..., as NCCL runs them: an
    exchange is posted when its rank gets there and ends once its messages are matched
    within its replica; an LLM action or ``BCAST`` ends once every replica's same rank has
    come to it (the same collective: each replica walks the same LLM order)."""

    def __init__(self, s: Schedule, programs, actions):
        self.replays = [_Replay(p) for p in programs]  # posts every exchange 0
        self.actions = actions
        self.in_action = [[False] * s.pipeline_model_parallel_size for _ in programs]

    @staticmethod
    def collective(a: Action) -> bool:  # across the replicas of a stage
        return a.kind in ("F", "B", "BCAST", "ALLREDUCE", "A2A", "A2A_B")

    def finished(self, j: int, r: int) -> bool:
        return self.replays[j].at[r] == len(self.replays[j].program[r])

    def run(self) -> None:
        replicas, pp = len(self.replays), len(self.in_action[0])
        while True:
            progressed = False
            for j, replay in enumerate(self.replays):
                for r in range(pp):
                    if (not self.finished(j, r) and not self.in_action[j][r]
                            and all(replay.matched(op) for op in replay.ops[r])):
                        if replay.at[r] == len(self.actions[j][r]):  # the last exchange
                            replay.at[r] += 1
                            replay.ops[r] = []
                        else:
                            self.in_action[j][r] = True
                        progressed = True
                    if self.in_action[j][r]:
                        a = self.actions[j][r][replay.at[r]]
                        if self.collective(a):
                            if not all(self.in_action[k][r] and self.collective(
                                    self.actions[k][r][self.replays[k].at[r]])
                                       for k in range(replicas)):
                                continue
                            group = range(replicas)  # they meet: all go on
                        else:
                            group = [j]
                        for k in group:
                            self.in_action[k][r] = False
                            self.replays[k].at[r] += 1
                            self.replays[k].post(r)
                        progressed = True
            if all(self.finished(j, r) for j in range(replicas) for r in range(pp)):
                return
            if not progressed:
                raise PlanError(
                    "encoder replicas deadlock: their pipeline exchanges and the LLM's TP "
                    "collectives wait on each other (" + "; ".join(
                        f"replica {j} rank {r} "
                        + (f"in {self.actions[j][r][self.replays[j].at[r]]}"
                           if self.in_action[j][r] else
                           f"in exchange {self.replays[j].at[r]}")
                        for j in range(replicas) for r in range(pp)
                        if not self.finished(j, r)) + ")")
