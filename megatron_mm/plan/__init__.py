"""Planning, pure Python (no torch): frozen-aware costs, partitions, estimates; the
multimodal attention mask and context-parallel token assignment (numpy).

    model = ModelSpec.from_config(config).with_freeze(encoders=True, projectors=False,
                                                      llm=True)
    chain = build_chain(model, Workload(seq_length=4096, recompute=True))
    part = partition(chain, pp=4, vpp=1, policy=parse_partition_flag("auto"))
    est = estimate(chain, part, num_microbatches=24)

Everything a plan holds is a dataclass with ``to_dict`` / ``from_dict`` (``Record``), so
the runtime that executes a plan and a simulator that replays it read the same data.
"""

from .context_parallel.attention_mask import dense_allowed, mask_codes
from .context_parallel.cp_assignment import CPAssignment, assign_tokens
from .costs.hardware import Hardware, MemoryModel
from .errors import PlanError
from .model import EncoderSpec, ModelSpec, TransformerSpec, Workload
from .pipeline.chain import build_chain
from .pipeline.describe import describe_chunk
from .pipeline.estimate import PipelineEstimate, estimate
from .pipeline.inflight import inflight_microbatches
from .pipeline.layers import KINDS, Layer, resolve_backward
from .pipeline.minmax import minmax_split
from .pipeline.partition import POLICIES, StagePartition, parse_partition_flag, partition
from .pipeline.planner import PipelinePlan, plan_pipeline
from .record import Record
from .schedules.encoder_planner import Candidate, EncoderSchedulePlan, plan_encoder_schedule

__all__ = [
    "KINDS", "POLICIES", "CPAssignment", "Candidate", "EncoderSchedulePlan",
    "EncoderSpec", "Hardware", "Layer", "MemoryModel",
    "ModelSpec", "PipelineEstimate", "PipelinePlan", "PlanError", "Record",
    "StagePartition", "TransformerSpec", "Workload", "assign_tokens", "build_chain",
    "dense_allowed", "mask_codes", "describe_chunk", "estimate", "inflight_microbatches",
    "minmax_split", "parse_partition_flag", "partition",
    "plan_encoder_schedule", "plan_pipeline", "resolve_backward",
]
