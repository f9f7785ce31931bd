"""The plan of a training run, computed once: the encoder schedule (the flags', or what
``--encoder-schedule auto`` chose and the alternatives it simulated), which modules each
model chunk holds, which layers it recomputes, and (``coarse|bubble``) the encoder pieces.

It is planned on the model with its real vocabulary (after the tokenizer loads), before
any process group exists, so a partition that cannot work is reported first. The same
object is then printed, built from and saved in the checkpoint. The plan is the one
source of the run's encoder schedule: the run reads its flags through ``run_config`` (the
RunConfig with the plan's schedule, encoder PP, encoder TP and pieces).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from ...plan import StagePartition, partition
from ...plan.pipeline.describe import describe_chunk, describe_contents
from ...plan.schedules.encoder_pipeline import EncoderPipelinePlan, split_chain
from ...plan.schedules.separate_placements import SeparatePlacements, separate_model_placements
from ...plan.pipeline.partition import parse_partition_flag
from ...plan.pipeline.placement import ChunkPlacement, chunk_placements
from ...plan.pipeline.recompute_budget import RecomputeChoice
from .chain import training_chain
from .encoder_schedule import encoder_pipeline_plan, separate_encoder
from .encoder_schedule_auto import EncoderScheduleChoice, encoder_schedule_choice
from .recompute import adaptive_choice, choice_line
from .separate_auto import encoder_trainable, separate_partition
from .time_inputs import hardware


@dataclass
class TrainingPlan:
    chain: list  # the planner's layers of this model (costs: cost model or --pipeline-profile)
    partition: StagePartition  # the LLM's (megatron schedule: the whole chain's)
    placements: List[ChunkPlacement]  # chunk order: (virtual stage) x pipeline rank
    recompute_num_layers: list  # per chunk: None, N, or {stack: N} under a budget
    policy: str  # how the partition was chosen (auto, uniform, search, 3,5 ...)
    encoder_plan: Optional[EncoderPipelinePlan] = None  # --encoder-schedule coarse|bubble
    recompute_choice: Optional[RecomputeChoice] = field(default=None, repr=False)
    schedule: Optional[EncoderScheduleChoice] = None  # the encoder schedule; None: the flags'
    # --encoder-schedule separate: the encoder ranks' chunk, the LLM's (``placements``),
    # and which encoders train
    separate: Optional[SeparatePlacements] = None
    separate_trainable: List[bool] = field(default_factory=list)

    def run_config(self, config):
        """``config`` (the RunConfig) with this plan's encoder schedule: what the run
        reads."""
        return self.schedule.applied(config) if self.schedule is not None else config

    def describe(self, config) -> str:
        config = self.run_config(config)
        lines = self.schedule.lines() if self.schedule is not None else []
        if self.encoder_plan is not None:
            return "\n".join(lines + [describe_encoder_plan(config, self.encoder_plan,
                                                             self.chain)])
        part = self.partition
        if part.pipeline_model_parallel_size > 1:
            lines.append(f"> pipeline partition ({self.policy}): layers per stage "
                         f"{part.layers_per_chunk} (an embedding, projector or output "
                         f"counts as one)")
            # separate: the partition is over the LLM's own chain (the encoders on their ranks)
            chain = self.chain if self.separate is None else split_chain(self.chain)[1]
            for c, (start, end) in enumerate(part.chunk_bounds()):
                lines.append(f"   chunk {c} (pipeline rank {part.rank_of_chunk(c)}): "
                             f"{describe_chunk(chain, start, end)}")
        if self.recompute_choice is not None:
            lines.append(choice_line(config, self.recompute_choice))
        return "\n".join(lines)

    def to_checkpoint(self) -> dict:
        """What the checkpoint records of the plan (plain values)."""
        out = {"policy": self.policy,
               "layers_per_chunk": list(self.partition.layers_per_chunk),
               "recompute_num_layers": list(self.recompute_num_layers)}
        if self.encoder_plan is not None:
            out["encoder_pieces"] = {p.name: [list(layers) for layers in p.layers]
                                     for p in self.encoder_plan.pieces}
        if self.schedule is not None:
            out["encoder_schedule"] = self.schedule.to_dict()
        return out


def describe_encoder_plan(config, plan, chain) -> str:
    """The LLM chunks (``chain``: the training chain) and the encoder pieces of
    ``--encoder-schedule coarse|bubble``."""
    part, llm = plan.llm_partition, split_chain(chain)[1]
    chunks = " | ".join(describe_contents(llm, s, e) for s, e in part.chunk_bounds())
    lines = [f"> encoder schedule {config.encoder_schedule.encoder_schedule}: LLM chunks "
             f"{chunks} ({part.policy}); " + ", ".join(
                 f"{pieces.name} {'trainable' if trainable else 'frozen'}, "
                 f"{len(pieces.ranks)} pieces"
                 for pieces, trainable in zip(plan.pieces, plan.trainable))]
    for pieces in plan.pieces:
        for p, (layers, rank) in enumerate(zip(pieces.layers, pieces.ranks)):
            lines.append(f"   {pieces.name} piece {p} (pipeline rank {rank}): layers "
                         f"{layers[0]}-{layers[1] - 1}")
    tp = config.parallel.tensor_model_parallel_size
    etp = config.encoder_schedule.encoder_tensor_model_parallel_size
    if etp and etp < tp:
        names = " and ".join(pieces.name for pieces in plan.pieces)
        lines.append(f"   {names} layers at TP {etp}: {tp // etp} replicas per TP group "
                     f"of {tp}, micro-batch m on replica m % {tp // etp}")
    return "\n".join(lines)


def plan_pipeline(config, model_config,
                  layers_per_chunk: Optional[Sequence[int]] = None,
                  policy_label: Optional[str] = None,
                  schedule: Optional[EncoderScheduleChoice] = None) -> TrainingPlan:
    """The plan for the flags and ``model_config`` (with its vocabulary).
    ``layers_per_chunk`` overrides ``--pipeline-partition`` (the partition search's
    candidates and its pick); ``schedule``: the encoder schedule already chosen (default:
    the flags', or ``--encoder-schedule auto``'s pick on this chain). Raises a ConfigError
    that names the flag."""
    pipeline, parallel = config.pipeline, config.parallel
    policy: Union[str, List[int]] = (list(layers_per_chunk) if layers_per_chunk is not None
                                     else parse_partition_flag(pipeline.pipeline_partition))
    label = policy_label or (policy if isinstance(policy, str)
                             else ",".join(map(str, policy)))
    chain = training_chain(config, model_config)
    schedule = schedule or encoder_schedule_choice(config, chain)
    recompute_num_layers = config.recompute.recompute_num_layers
    if schedule.encoder_schedule == "separate":  # the LLM partitioned over its own chain
        # (with auto's pick: at the placement's sizes)
        part = separate_partition(schedule.applied(config), chain, policy)
        places = separate_model_placements(chain, part)
        return TrainingPlan(chain, part, places.llm, [recompute_num_layers] * part.num_chunks,
                            label, schedule=schedule, separate=places,
                            separate_trainable=encoder_trainable(chain))
    if separate_encoder(schedule):
        plan = encoder_pipeline_plan(schedule.applied(config), chain, policy)
        return TrainingPlan(chain, plan.llm_partition, plan.placements,
                            [recompute_num_layers] * len(plan.placements), label, plan,
                            schedule=schedule)
    limit = pipeline.memory_limit_gb * 1024 ** 3 if pipeline.memory_limit_gb else None
    part = partition(chain, parallel.pipeline_model_parallel_size,
                     parallel.virtual_pipeline_model_parallel_size or 1, policy,
                     memory_limit_bytes=limit, num_microbatches=config.training.num_microbatches,
                     search_radius=pipeline.pipeline_search_radius,
                     hardware=hardware(pipeline))
    choice = None
    recompute = [recompute_num_layers] * part.num_chunks
    if config.recompute.recompute_memory_budget is not None and policy != "search":
        # (before --pipeline-partition search: each candidate's trial, and the partition
        # it keeps, are planned with their own layers and choose then)
        choice = adaptive_choice(config, part, chain)
        recompute = list(choice.recompute_num_layers)
    return TrainingPlan(chain, part, chunk_placements(chain, part), recompute, label,
                        recompute_choice=choice, schedule=schedule)
