"""Replay pipeline schedules on per-action costs; write the timeline as a Chrome trace and
a PNG, print iteration time, busy and idle time per rank and the bubble fraction.

    python tools/simulate_schedule.py --pipeline-model-parallel-size 4 \
        --num-microbatches 8 --encoder-forward 2 --encoder-backward 4 --trace-out t.json \
        --png-out t.png

Costs are per micro-batch, in any unit: an LLM chunk's forward and backward (every chunk
alike), and the whole encoder's forward and backward. ``megatron`` puts the encoder inside
chunk 0; ``coarse`` splits it evenly over the ranks as its own pipeline; ``bubble``
(Optimus) cuts each encoder stage into ``--encoder-pieces`` pieces and schedules them into
the LLM's idle time (``--encoder-placement reverse``: the encoder ends on the LLM's first
rank). The hidden column is the share of encoder work that does not lengthen the iteration.
``--encoder-data-parallel-size E`` adds ``separate``: the whole encoder on E encoder ranks
of their own (its forward and backward costs per encoder rank), next to the PP LLM ranks
(``--llm-data-parallel-size`` replicas of them), the encoder ranks listed last.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_mm.plan import PlanError  # noqa: E402
from megatron_mm.plan.schedules.actions import validate  # noqa: E402
from megatron_mm.plan.schedules.bubble import bubble  # noqa: E402
from megatron_mm.plan.schedules.generate import coarse, megatron  # noqa: E402
from megatron_mm.plan.schedules.separate import separate  # noqa: E402
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate  # noqa: E402
from megatron_mm.plan.schedules.timeline import write_chrome_trace, write_png  # noqa: E402

def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pipeline-model-parallel-size", type=int, default=4)
    p.add_argument("--virtual-pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--num-microbatches", type=int, default=8)
    p.add_argument("--llm-forward", type=float, default=1.0, help="per chunk")
    p.add_argument("--llm-backward", type=float, default=2.0, help="per chunk")
    p.add_argument("--encoder-forward", type=float, default=0.0, help="whole encoder")
    p.add_argument("--encoder-backward", type=float, default=0.0,
                   help="whole encoder; 0: frozen")
    p.add_argument("--p2p", type=float, default=0.0, help="per transfer between ranks")
    p.add_argument("--encoder-pieces", type=int, default=2,
                   help="bubble schedule: pieces per encoder stage")
    p.add_argument("--encoder-placement", choices=["forward", "reverse"], default="reverse",
                   help="bubble schedule: encoder stage 0 on rank 0 or on the last rank")
    p.add_argument("--encoder-data-parallel-size", type=int, default=None,
                   help="add the separate placement: the encoder on this many ranks of its "
                        "own")
    p.add_argument("--llm-data-parallel-size", type=int, default=1,
                   help="separate placement: LLM replicas the encoder ranks serve (each "
                        "its --num-microbatches)")
    p.add_argument("--trace-out", default=None, help="Chrome trace (JSON) of every schedule")
    p.add_argument("--png-out", default=None, help="timeline PNG of every schedule")
    args = p.parse_args(argv)
    pp, vpp, m = (args.pipeline_model_parallel_size,
                  args.virtual_pipeline_model_parallel_size, args.num_microbatches)
    chunks = pp * vpp
    trainable = args.encoder_backward > 0
    try:
        baseline = megatron(pp, vpp, m)
        first = ActionCosts([args.llm_forward + args.encoder_forward * (c == 0)
                             for c in range(chunks)],
                            [args.llm_backward + args.encoder_backward * (c == 0)
                             for c in range(chunks)], p2p_s=args.p2p)
        spread = coarse(pp, vpp, m, trainable)
        split = ActionCosts([args.llm_forward] * chunks, [args.llm_backward] * chunks,
                            [args.encoder_forward / pp] * pp,
                            [args.encoder_backward / pp] * pp, p2p_s=args.p2p)
        k = args.encoder_pieces
        if k < 1:
            raise PlanError(f"--encoder-pieces must be at least 1 (got {k})")
        pieces = ActionCosts([args.llm_forward] * chunks, [args.llm_backward] * chunks,
                             [args.encoder_forward / (pp * k)] * (pp * k),
                             [args.encoder_backward / (pp * k)] * (pp * k), p2p_s=args.p2p)
        filled = bubble(pp, vpp, m, trainable, pieces, pp, k,
                        args.encoder_placement == "reverse")
        plans = [(baseline, first), (spread, split), (filled, pieces)]
        if args.encoder_data_parallel_size is not None:
            whole = ActionCosts([args.llm_forward] * chunks, [args.llm_backward] * chunks,
                                [args.encoder_forward], [args.encoder_backward],
                                p2p_s=args.p2p)
            plans.append((separate(pp, vpp, m, args.llm_data_parallel_size,
                                   args.encoder_data_parallel_size, trainable, costs=whole),
                          whole))
        runs = []
        for schedule, costs in plans:
            validate(schedule)
            runs.append(simulate(schedule, costs))
    except PlanError as e:
        p.error(str(e))
    print(f"PP {pp} x VPP {vpp}, {m} micro-batches; LLM chunk F {args.llm_forward} "
          f"B {args.llm_backward}; encoder F {args.encoder_forward} B {args.encoder_backward}")
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
        write_png(runs, args.png_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
