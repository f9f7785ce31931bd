"""The point-to-point messages of a schedule, grouped into exchanges NCCL cannot deadlock.

Every rank walks its own action list. Before action i it makes one exchange: the sends
that action i - 1 produced and the receives action i needs go out together (one
``batch_isend_irecv``, as Megatron-Core's p2p does), and the rank waits for them. NCCL
matches a pair of ranks' messages by order, not by tag, so a receiver posts a peer's
messages in the order that peer sends them: needing a message pulls forward the receives
of every earlier one from the same peer (kept until their action; an encoder piece's
output may be sent before an LLM activation the receiver needs first).

``check_rendezvous`` replays the exchanges as NCCL runs them (a send completes only once
its receive is posted; a rank's exchanges run one after another) and names the blocked
messages of an ordering that would hang. Messages between actions on the same rank stay
local and are not listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from .actions import Action, Schedule
from .errors import PlanError
from .record import Record

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
        return [(("EF", m, end - 1), Action("EF", m, end - 1)) for _, end in s.encoder_spans()]
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


def p2p_program(s: Schedule, ranks: Sequence[Sequence[Action]],
                safe: bool = True) -> List[List[Exchange]]:
    """Per rank, ``len(actions) + 1`` exchanges: exchange i runs before action i (the
    last one after the last action) for the action lists ``ranks`` (the schedule's, or
    the subset an iteration runs: forwards only, one encoder replica's micro-batches).
    A message exists when its producer and consumer both run, on different ranks.

    Each receive is posted as late as its consumer allows (and in its peer's send
    order); where that would leave a send waiting while its receiver blocks in an earlier
    exchange (NCCL's send/send cycle), the receive moves into that exchange (``safe``;
    without it, the late program is returned as it is)."""
    where: Dict[Key, Tuple[int, int]] = {}  # action key -> (rank, index)
    for r, actions in enumerate(ranks):
        for i, a in enumerate(actions):
            where[a.key] = (r, i)
    program = [[Exchange() for _ in range(len(actions) + 1)] for actions in ranks]
    needed: List[List[Tuple[int, Key]]] = [[] for _ in ranks]  # per rank: remote inputs
    channel: Dict[Tuple[int, int], List[Key]] = {}  # (src, dst) -> messages in send order
    sent: List[Tuple[int, int, int, Key]] = []  # (src, index, dst, key)
    for r, actions in enumerate(ranks):
        for i, a in enumerate(actions):
            for key, producer in message_inputs(s, a):
                if producer.key not in where:
                    continue
                src, j = where[producer.key]
                if src != r:
                    sent.append((src, j, r, key))
    # A rank sends in action order, one action's messages by (receiver, key): every rank
    # computes the same order.
    for src, j, dst, key in sorted(sent):
        program[src][j + 1].sends.append(Transfer(dst, list(key)))
        channel.setdefault((src, dst), []).append(key)
    for r, actions in enumerate(ranks):
        posted: Dict[int, int] = {}  # per source: how many of its messages are posted
        for i, a in enumerate(actions):
            for key, producer in message_inputs(s, a):
                if producer.key not in where or where[producer.key][0] == r:
                    continue
                src = where[producer.key][0]
                queue = channel[(src, r)]
                stop = queue.index(key) + 1
                for k in queue[posted.get(src, 0):stop]:
                    program[r][i].recvs.append(Transfer(src, list(k)))
                posted[src] = max(posted.get(src, 0), stop)
    if safe:
        _Replay(program).run(repair=True)
    return program


def check_rendezvous(program: List[List[Exchange]]) -> None:
    """Raise ``PlanError`` if the exchanges can hang when a send completes only once its
    receive is posted (NCCL; gloo under ``MEGATRON_MM_STRICT_P2P=1``) and a rank posts
    exchange i + 1 only once every message of exchange i is matched."""
    _Replay(program).run(repair=False)


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

    def run(self, repair: bool) -> None:
        """Replay to the end; with ``repair``, a send left waiting because its receiver
        blocks in an earlier exchange has its receive (and the channel's earlier ones)
        moved into that exchange, where it matches at once."""
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
            if progressed:
                continue
            waiting = [op for r in range(len(self.program)) for op in self.ops[r]
                       if op[0] == "send" and not self.matched(op)]
            if not repair or not waiting:
                raise PlanError(self.deadlock())
            _, src, dst, n, _ = waiting[0]
            self.pull(dst, src, n)

    def pull(self, dst: int, src: int, n: int) -> None:
        """Move the receives of messages ``< n + 1`` on channel src -> dst that ``dst``
        has not posted into its current exchange."""
        here = self.program[dst][self.at[dst]]
        for ex in self.program[dst][self.at[dst] + 1:]:
            while self.posted.get(("recv", src, dst), 0) <= n:
                t = next((t for t in ex.recvs if t.peer == src), None)
                if t is None:
                    break
                ex.recvs.remove(t)
                here.recvs.append(t)
                self.add(dst, "recv", t)

    def deadlock(self) -> str:
        return ("the pipeline's point-to-point exchanges deadlock when a send waits for "
                "its receive (as NCCL's do): " + "; ".join(
                    f"rank {r} in exchange {self.at[r]} waits for the "
                    + ", ".join(f"{what} of {key} {'to' if what == 'send' else 'from'} "
                                f"rank {dst if what == 'send' else src}"
                                for what, src, dst, _, key in self.ops[r]
                                if not self.matched((what, src, dst, _, key)))
                    for r in range(len(self.program)) if self.at[r] < len(self.program[r])))
