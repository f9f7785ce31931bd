"""Replay pipeline schedules on per-action costs; write the timeline as a Chrome trace and
a PNG, print iteration time, busy and idle time per rank and the bubble fraction.

    python tools/simulate_schedule.py --pipeline-model-parallel-size 4 \
        --num-microbatches 8 --encoder-forward 2 --encoder-backward 4 --trace-out t.json \
        --png-out t.png

Costs are times per micro-batch, in one time unit of your choice (ms, s, or "an LLM chunk's
forward" as the defaults: every cost, the table and the PNG's axis are in it): an LLM
chunk's forward and backward (every chunk alike), and each encoder's forward and
backward, whole (one value per encoder, in chain order, e.g. vision then audio:
``--encoder-forward 2 1 --encoder-backward 4 0``, a backward of 0 a frozen encoder). The
defaults (an encoder of twice an LLM chunk's forward, trained) show what each schedule
does with it. ``megatron`` puts the encoders inside
chunk 0; ``coarse`` splits each evenly over the ranks as its own pipeline; ``bubble``
(Optimus) cuts each encoder stage into ``--encoder-pieces`` pieces and schedules them into
the LLM's idle time (``--encoder-placement reverse``: the encoder ends on the LLM's first
rank). The hidden column is the share of encoder work that does not lengthen the iteration.
``--encoder-data-parallel-size E`` adds ``separate``: the encoders whole on E encoder ranks
of their own, shared (their forward and backward costs per encoder rank), or one E per
encoder (each on replicas of its own), next to the PP LLM ranks
(``--llm-data-parallel-size`` replicas of them), the encoder ranks listed last. Each
encoder's message to the LLM (``--encoder-message``: one copy's time, its DeepStack
outputs included; default ``--p2p``) goes from the encoder rank to each of the LLM first
stage's ``--tensor-model-parallel-size`` x ``--context-parallel-size`` ranks, its gradient
back to each of the ``--encoder-tensor-model-parallel-size`` ranks of the encoder replica,
as the run sends them: the copies leave one rank, so a direction costs its copies times
one (these sizes change nothing else: the costs given are per rank). With a
``--context-parallel-size`` above 1 the first stage's ``B(g, 0)`` all-reduces each trained
encoder's gradient over the CP ranks before sending it (``--encoder-grad-allreduce``:
its time per encoder; default the ring's 2 (CP - 1) / CP copies of the message).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_mm.plan import PlanError  # noqa: E402
from megatron_mm.plan.schedules.actions import validate  # noqa: E402
from megatron_mm.plan.schedules.bubble import bubble  # noqa: E402
from megatron_mm.plan.schedules.generate import ScheduleProblem, coarse, megatron  # noqa: E402
from megatron_mm.plan.schedules.separate import separate  # noqa: E402
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate  # noqa: E402
from megatron_mm.plan.schedules.timeline import write_chrome_trace, write_png  # noqa: E402

def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pipeline-model-parallel-size", type=int, default=4)
    p.add_argument("--virtual-pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--num-microbatches", type=int, default=8)
    p.add_argument("--llm-forward", type=float, default=1.0,
                   help="time per chunk and micro-batch, in time units (the table's)")
    p.add_argument("--llm-backward", type=float, default=2.0,
                   help="time per chunk and micro-batch, in time units")
    p.add_argument("--encoder-forward", type=float, nargs="+", default=[2.0],
                   help="time per micro-batch of each encoder, whole, in time units "
                        "(default: one encoder of 2)")
    p.add_argument("--encoder-backward", type=float, nargs="+", default=None,
                   help="time per micro-batch of each encoder, whole, in time units; 0: "
                        "frozen (default: twice each forward)")
    p.add_argument("--p2p", type=float, default=0.0,
                   help="time per transfer between ranks, in time units")
    p.add_argument("--encoder-pieces", type=int, default=2,
                   help="bubble schedule: pieces per encoder stage")
    p.add_argument("--encoder-placement", choices=["forward", "reverse"], default="reverse",
                   help="bubble schedule: encoder stage 0 on rank 0 or on the last rank")
    p.add_argument("--encoder-data-parallel-size", type=int, nargs="+", default=None,
                   help="add the separate placement: the encoders on this many ranks of "
                        "their own, or one count per encoder (each on replicas of its own)")
    p.add_argument("--llm-data-parallel-size", type=int, default=1,
                   help="separate placement: LLM replicas the encoder ranks serve (each "
                        "its --num-microbatches)")
    p.add_argument("--encoder-message", type=float, nargs="+", default=None,
                   help="separate placement: each encoder's output message to one LLM rank "
                        "(DeepStack outputs included), and its gradient's (default: --p2p)")
    p.add_argument("--tensor-model-parallel-size", type=int, default=1,
                   help="separate placement: with --context-parallel-size, the LLM ranks "
                        "each encoder output is sent to")
    p.add_argument("--context-parallel-size", type=int, default=1,
                   help="separate placement: see --tensor-model-parallel-size")
    p.add_argument("--encoder-grad-allreduce", type=float, nargs="+", default=None,
                   help="separate placement: each encoder's gradient all-reduce over the "
                        "--context-parallel-size ranks in the first stage's backward "
                        "(default: 2 (CP - 1) / CP x --encoder-message)")
    p.add_argument("--encoder-tensor-model-parallel-size", type=int, default=1,
                   help="separate placement: the encoder ranks each gradient is sent to")
    p.add_argument("--trace-out", default=None, help="Chrome trace (JSON) of every schedule")
    p.add_argument("--png-out", default=None,
                   help="timeline PNG of every schedule (a time axis, a legend)")
    p.add_argument("--unit", default="time units",
                   help="the costs' time unit, as the PNG's axis names it (e.g. ms)")
    args = p.parse_args(argv)
    pp, vpp, m = (args.pipeline_model_parallel_size,
                  args.virtual_pipeline_model_parallel_size, args.num_microbatches)
    chunks = pp * vpp
    forward = args.encoder_forward
    n = len(forward)
    backward = [2 * f for f in forward] if args.encoder_backward is None else args.encoder_backward
    message = [args.p2p] * n if args.encoder_message is None else args.encoder_message
    cp = args.context_parallel_size
    allreduce = ([2 * (cp - 1) / cp * t for t in message] if args.encoder_grad_allreduce is None
                 else args.encoder_grad_allreduce)
    if len(backward) != n or len(message) != n or len(allreduce) != n:
        p.error(f"--encoder-backward, --encoder-message and --encoder-grad-allreduce take one "
                f"value per encoder, as --encoder-forward ({n})")
    frozen = [e for e, b in enumerate(backward) if b <= 0]
    trainable = len(frozen) < n
    encoders = dict(encoders=n, frozen_encoders=frozen)

    def per_piece(costs, k):  # each encoder cut into k equal pieces, one after the other
        return [c / k for c in costs for _ in range(k)]

    try:
        baseline = megatron(pp, vpp, m)
        first = ActionCosts([args.llm_forward + sum(forward) * (c == 0)
                             for c in range(chunks)],
                            [args.llm_backward + sum(backward) * (c == 0)
                             for c in range(chunks)], p2p_s=args.p2p)
        problem = ScheduleProblem(pp, m, virtual_pipeline_model_parallel_size=vpp,
                                  encoder_trainable=trainable, **encoders)
        spread = coarse(problem)
        split = ActionCosts([args.llm_forward] * chunks, [args.llm_backward] * chunks,
                            per_piece(forward, pp), per_piece(backward, pp), p2p_s=args.p2p)
        k = args.encoder_pieces
        if k < 1:
            raise PlanError(f"--encoder-pieces must be at least 1 (got {k})")
        pieces = ActionCosts([args.llm_forward] * chunks, [args.llm_backward] * chunks,
                             per_piece(forward, pp * k), per_piece(backward, pp * k),
                             p2p_s=args.p2p)
        filled = bubble(replace(problem, costs=pieces, encoder_stages=pp, pieces=k,
                                reverse=args.encoder_placement == "reverse"))
        plans = [(baseline, first), (spread, split), (filled, pieces)]
        if args.encoder_data_parallel_size is not None:
            sizes = args.encoder_data_parallel_size
            if len(sizes) not in (1, n):
                raise PlanError(f"--encoder-data-parallel-size takes one count, or one per "
                                f"encoder ({n}); got {len(sizes)}")
            copies = args.tensor_model_parallel_size * cp
            # B(g, 0) sums each trained encoder's gradient over the CP ranks
            summed = sum(t for t, b in zip(allreduce, backward) if b > 0) if cp > 1 else 0.0
            whole = ActionCosts([args.llm_forward] * chunks,
                                [args.llm_backward + summed * (c == 0) for c in range(chunks)],
                                forward, backward, p2p_s=args.p2p,
                                encoder_output_p2p_s=[copies * t for t in message],
                                encoder_grad_p2p_s=[args.encoder_tensor_model_parallel_size
                                                    * t for t in message])
            own = sizes if len(sizes) > 1 else []
            plans.append((separate(replace(
                problem, costs=whole, llm_data_parallel_size=args.llm_data_parallel_size,
                encoder_data_parallel_size=sum(sizes), encoder_data_parallel_sizes=own)),
                whole))
        runs = []
        for schedule, costs in plans:
            validate(schedule)
            runs.append(simulate(schedule, costs))
    except PlanError as e:
        p.error(str(e))
    print(f"PP {pp} x VPP {vpp}, {m} micro-batches; times in {args.unit}: LLM chunk "
          f"F {args.llm_forward} B {args.llm_backward}; " + ", ".join(
              f"encoder {e} F {f:g} B {b:g}" for e, (f, b) in enumerate(zip(forward, backward))))
    print("| schedule | iteration | bubble fraction | busy per rank | idle per rank | "
          "hidden |")
    print("| --- | --- | --- | --- | --- | --- |")
    for sim in runs:
        hidden = ("-" if sim.encoder_hidden_fraction is None
                  else f"{sim.encoder_hidden_fraction:.0%}")
        print(f"| {sim.schedule} | {sim.iteration_s:.2f} | {sim.bubble_fraction:.3f} | "
              f"{', '.join(f'{b:.1f}' for b in sim.busy_s)} | "
              f"{', '.join(f'{i:.1f}' for i in sim.idle_s)} | {hidden} |")
    if args.trace_out:
        write_chrome_trace(runs, args.trace_out)
    if args.png_out:
        write_png(runs, args.png_out, unit=args.unit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
