"""Measure every layer's forward and backward time on the real model, on this machine.

    python tools/profile_layers.py <training flags> --profile-out profile.json

The flags are the training script's (model sizes, --freeze-*, --micro-batch-size,
--seq-length, data); the model is built whole (no pipelining) in one process, each layer
of the planner's chain runs alone on real micro-batches, and the median times go to a
layer profile that ``--pipeline-profile`` (training, tools/plan.py) feeds to the
partitioner in place of the FLOP cost model. Prints the per-layer table.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: Optional[Sequence[str]] = None) -> int:
    tool = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    tool.add_argument("--profile-out", required=True, help="where to write the profile")
    tool.add_argument("--profile-micro-batches", type=int, default=5,
                      help="micro-batches to time (after one warm-up)")
    ours, train_argv = tool.parse_known_args(argv)

    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.cli.arguments import parse_args

    args = parse_args(train_argv, world_size=1)
    if args.pipeline_model_parallel_size != 1 or args.tensor_model_parallel_size != 1:
        print("profile_layers.py measures the whole model in one process: drop "
              "--pipeline-model-parallel-size and --tensor-model-parallel-size",
              file=sys.stderr)
        return 2

    from megatron_mm.training.loop.layer_profile import profile_layers
    from megatron_mm.training.assembly.initialize import shutdown_distributed
    from megatron_mm.training.planning.chain import training_chain
    from megatron_mm.training.assembly.data_setup import batch_iterator
    from megatron_mm.training.pretrain import setup_training
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.assembly.initialize import batch_to_device

    run = setup_training(RunConfig.from_flags(args))
    chain = training_chain(run.config, run.model_config)  # the run's vocabulary
    batches = batch_iterator(run.config, run.train_ds, run.tokenizer, 0, shuffle=True)
    batches = [batch_to_device(next(batches)) for _ in range(ours.profile_micro_batches + 1)]
    frozen = sorted(m for m in ("language_model", "vision_model", "vision_projection")
                    if _frozen(args, m))
    profile = profile_layers(run.model[0], chain, batches, warmup=1,
                             meta={"seq_length": args.seq_length, "frozen": frozen})
    profile.save(ours.profile_out)
    print(f"layer profile of {len(chain)} layers on {profile.device}, micro-batch "
          f"{profile.micro_batch_size}, median of {ours.profile_micro_batches}; "
          f"frozen: {', '.join(frozen) or 'nothing'}")
    print("| layer | forward ms | backward ms | backward / forward | saved MB | "
          "saved MB recomputed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for t in profile.layers:
        ratio = t.backward_s / t.forward_s if t.forward_s else 0.0
        print(f"| {t.module} | {t.forward_s * 1e3:.2f} | {t.backward_s * 1e3:.2f} | "
              f"{ratio:.2f} | {t.act_bytes / 1e6:.3f} | {t.recompute_act_bytes / 1e6:.3f} |")
    print(f"wrote {ours.profile_out}")
    shutdown_distributed()
    return 0


def _frozen(args, module: str) -> bool:
    return {"language_model": args.freeze_LM, "vision_model": args.freeze_ViT,
            "vision_projection": args.freeze_projector}[module]


if __name__ == "__main__":
    sys.exit(main())
