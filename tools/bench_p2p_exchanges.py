"""What the schedule executor's point-to-point exchanges cost on NCCL, by a timed model.

    python tools/bench_p2p_exchanges.py [--microbatches 8]

For Megatron-Core's 1F1B, the coarse and the bubble schedule at PP 2 and 4 with one and
two trainable encoders (per-action seconds below: later chunks and pieces a little
slower), it prints the iteration time of the plan's simulator (``plan.simulate``: sends
buffered, what gloo without strict mode gives) beside a replay of ``plan.p2p``'s
exchanges as NCCL runs them: a rank's exchanges run in order on one stream, an exchange
completes once every one of its messages has been posted by both sides, the host waits
only for exchanges with receives. ``late`` posts each receive just before its action
(``p2p_program(late=True)``), ``timed`` is what the executor runs. A model, not a
measurement: no GPU here.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_mm.plan.schedules.bubble import bubble  # noqa: E402
from megatron_mm.plan.schedules.generate import ScheduleProblem, coarse, megatron  # noqa: E402
from megatron_mm.plan.schedules.p2p import p2p_program  # noqa: E402
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate  # noqa: E402


def nccl_time(ranks, program, cost) -> float:
    """Iteration seconds of ``program`` under NCCL's rules (inf: it hangs)."""
    where = {}  # (what, src, dst, n) -> (rank, exchange)
    for r, exchanges in enumerate(program):
        count = {}
        for k, ex in enumerate(exchanges):
            for what, transfers in (("send", ex.sends), ("recv", ex.recvs)):
                for t in transfers:
                    ch = (what, r, t.peer) if what == "send" else (what, t.peer, r)
                    where[ch + (count.get(ch, 0),)] = (r, k)
                    count[ch] = count.get(ch, 0) + 1
    partners = [[[] for _ in ex] for ex in program]  # the exchanges an exchange waits on
    for (what, src, dst, n), (r, k) in where.items():
        other = "recv" if what == "send" else "send"
        partners[r][k].append(where[(other, src, dst, n)])
    n_ranks = len(program)
    issued = [[None] * len(p) for p in program]
    started = [[None] * len(p) for p in program]
    done = [[None] * len(p) for p in program]
    host, clock, stream = [0] * n_ranks, [0.0] * n_ranks, [0] * n_ranks
    while any(host[r] < len(program[r]) for r in range(n_ranks)):
        progressed = False
        for r in range(n_ranks):
            while host[r] < len(program[r]):  # the host issues, waits for receives, runs
                k = host[r]
                if issued[r][k] is None:
                    issued[r][k] = clock[r]
                t = clock[r]
                if program[r][k].recvs:
                    if done[r][k] is None:
                        break
                    t = max(t, done[r][k])
                clock[r] = t + (cost(ranks[r][k]) if k < len(ranks[r]) else 0.0)
                host[r] += 1
                progressed = True
            while stream[r] < len(program[r]) and issued[r][stream[r]] is not None:
                k = stream[r]  # the stream runs exchanges in order
                if started[r][k] is None:
                    started[r][k] = max(issued[r][k], done[r][k - 1] if k else 0.0)
                    progressed = True
                other = [started[q][j] for q, j in partners[r][k]]
                if None in other:
                    break
                done[r][k] = max([started[r][k]] + other)
                stream[r] += 1
                progressed = True
        if not progressed:
            return math.inf
    return max(max(clock), max(d[-1] for d in done))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--microbatches", type=int, default=8)
    args = parser.parse_args(argv)
    m = args.microbatches
    print(f"{'schedule':9s} {'PP':>2s} {'enc':>3s} {'buffered':>9s} {'late':>9s} "
          f"{'timed':>9s} {'timed/buffered':>15s}")
    for pp in (2, 4):
        for enc in (1, 2):
            n = pp * enc
            costs = ActionCosts([1.0 + 0.3 * c for c in range(pp)],
                                [2.0 + 0.5 * c for c in range(pp)],
                                encoder_forward_s=[0.7 + 0.1 * p for p in range(n)],
                                encoder_backward_s=[1.4] * n)

            def cost(a):
                return costs.of(a.kind, a.chunk)

            schedules = [coarse(ScheduleProblem(pp, m, encoders=enc)),
                         bubble(ScheduleProblem(pp, m, encoders=enc, costs=costs),
                                extra_warmup="auto")]
            for s in ([megatron(pp, 1, m)] if enc == 1 else []) + schedules:
                c = ActionCosts(costs.forward_s, costs.backward_s) if not s.encoder_stages \
                    else costs
                buffered = simulate(s, c, timeline=False).iteration_s
                late = nccl_time(s.ranks, p2p_program(s, s.ranks, late=True), cost)
                timed = nccl_time(s.ranks, p2p_program(s, s.ranks), cost)
                print(f"{s.name:9s} {pp:2d} {enc if s.encoder_stages else 0:3d} "
                      f"{buffered:9.1f} {('hangs' if late == math.inf else f'{late:.1f}'):>9s} "
                      f"{timed:9.1f} {timed / buffered:15.3f}")


if __name__ == "__main__":
    main()
