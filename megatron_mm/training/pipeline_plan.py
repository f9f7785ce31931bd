"""The pipeline plan of a training run: which modules each model chunk holds.

``--pipeline-partition`` picks the policy (``uniform``: Megatron-Core's layout; ``auto``:
frozen-aware min-max; or layers per stage), over the planner's chain of this model with
its costs from the cost model or, with ``--pipeline-profile``, from measured times.
"""

from __future__ import annotations

from typing import List, Tuple

from ..models import model_chain
from ..plan import StagePartition, partition
from ..plan.pipeline.partition import parse_partition_flag
from ..plan.pipeline.placement import ChunkPlacement, chunk_placements
from ..plan.pipeline.profile import LayerProfile, apply_profile


def training_chain(args, model_config=None):
    """The chain of ``model_config`` (default: the flags', whose vocabulary the caller
    has set) at the run's shapes."""
    chain = model_chain(model_config or args.model_config, args.seq_length,
                        args.micro_batch_size, args.tensor_model_parallel_size)
    if getattr(args, "pipeline_profile", None):
        chain = apply_profile(chain, LayerProfile.load(args.pipeline_profile))
    return chain


def plan_pipeline(args) -> Tuple[StagePartition, List[ChunkPlacement]]:
    chain = training_chain(args)
    limit = args.memory_limit_gb * 1024 ** 3 if args.memory_limit_gb else None
    part = partition(chain, args.pipeline_model_parallel_size,
                     args.virtual_pipeline_model_parallel_size or 1,
                     parse_partition_flag(args.pipeline_partition),
                     memory_limit_bytes=limit, num_microbatches=args.num_microbatches,
                     search_radius=getattr(args, "pipeline_search_radius", 1))
    return part, chunk_placements(chain, part)


def describe_encoder_plan(args, plan) -> str:
    """The LLM chunks and the encoder pieces of ``--encoder-schedule coarse|bubble``."""
    part = plan.llm_partition
    lines = [f"> encoder schedule {args.encoder_schedule}: LLM layers per chunk "
             f"{part.layers_per_chunk} ({part.policy}); " + ", ".join(
                 f"{pieces.name} {'trainable' if trainable else 'frozen'}, "
                 f"{len(pieces.ranks)} pieces"
                 for pieces, trainable in zip(plan.pieces, plan.trainable))]
    for pieces in plan.pieces:
        for p, (layers, rank) in enumerate(zip(pieces.layers, pieces.ranks)):
            lines.append(f"   {pieces.name} piece {p} (pipeline rank {rank}): layers "
                         f"{layers[0]}-{layers[1] - 1}")
    tp = args.tensor_model_parallel_size
    etp = getattr(args, "encoder_tensor_model_parallel_size", None)
    if etp and etp < tp:
        names = " and ".join(pieces.name for pieces in plan.pieces)
        lines.append(f"   {names} layers at TP {etp}: {tp // etp} replicas per TP group "
                     f"of {tp}, micro-batch m on replica m % {tp // etp}")
    return "\n".join(lines)
