"""Uniform (Megatron) vs freeze-unaware balanced vs frozen-aware partitions of zoo models.

A ``Scenario`` fixes a zoo model, its freezing, the parallel layout and the workload; each
policy partitions the same chain and is timed with the same frozen-aware cost model, so the
differences come from where the stage boundaries fall.

Cornstarch setting (its benchmark harness, seed-systems.md B.1): encoders and LLM frozen,
projectors trained, activation checkpointing everywhere, 24 micro-batches of one sample,
1024 text tokens plus the media tokens of one 1280x720 image and/or 30 s of audio. Its
pipelines are DAGs (each encoder on its own ranks, 5 LLM stages); ours is Megatron's chain,
so the table uses PP = 4 chain stages (override with the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..plan.costs.hardware import Hardware, MemoryModel
from ..plan.model import Workload
from ..plan.pipeline.chain import build_chain
from ..plan.pipeline.planner import PipelinePlan, plan_pipeline
from ..plan.record import Record
from . import model_zoo

COMPARED = ("uniform", "balanced", "auto")


@dataclass
class Scenario(Record):
    pair: str  # a model_zoo.PAIRS name
    pipeline_model_parallel_size: int = 4
    virtual_pipeline_model_parallel_size: int = 1
    num_microbatches: int = 24
    micro_batch_size: int = 1
    text_tokens: int = 1024  # LLM tokens besides the media tokens
    tensor_model_parallel_size: int = 1
    recompute: bool = True
    freeze_encoders: bool = True
    freeze_projectors: bool = False
    freeze_llm: bool = True
    img_h: int = 720
    img_w: int = 1280
    audio_seconds: float = 30.0

    def chain(self):
        model = model_zoo.model_pair(self.pair, self.img_h, self.img_w, self.audio_seconds)
        model = model.with_freeze(self.freeze_encoders, self.freeze_projectors,
                                  self.freeze_llm)
        workload = Workload(seq_length=self.text_tokens + model.media_tokens_per_sample,
                            micro_batch_size=self.micro_batch_size, recompute=self.recompute,
                            tensor_model_parallel_size=self.tensor_model_parallel_size)
        return model, workload, build_chain(model, workload)


@dataclass
class Comparison(Record):
    scenario: Scenario
    model_name: str
    seq_length: int
    plans: Dict[str, PipelinePlan] = field(default_factory=dict)

    def iteration_s(self, policy: str) -> float:
        return self.plans[policy].estimate.iteration_s

    @property
    def speedup(self) -> float:
        """Megatron's uniform layout over the frozen-aware one."""
        return self.iteration_s("uniform") / self.iteration_s("auto")

    @property
    def speedup_over_balanced(self) -> float:
        return self.iteration_s("balanced") / self.iteration_s("auto")


def compare(scenario: Scenario, hardware: Optional[Hardware] = None,
            memory: Optional[MemoryModel] = None,
            memory_limit_bytes: Optional[float] = None) -> Comparison:
    model, workload, chain = scenario.chain()
    result = Comparison(scenario=scenario, model_name=model.name,
                        seq_length=workload.seq_length)
    for policy in COMPARED:
        # the limit steers auto; the baselines are reported as they are (memory column)
        limit = memory_limit_bytes if policy == "auto" else None
        result.plans[policy] = plan_pipeline(
            chain, scenario.pipeline_model_parallel_size,
            scenario.virtual_pipeline_model_parallel_size, policy, scenario.num_microbatches,
            hardware, memory, limit)
    return result


def cornstarch_scenarios(**overrides) -> List[Scenario]:
    return [Scenario(pair=name, **overrides) for name in model_zoo.CORNSTARCH_PAIRS]


def optimus_scenarios(trainable: bool, **overrides) -> List[Scenario]:
    """Optimus' Megatron layouts (Appendix D): micro-batch 2, 2048 tokens with one 448 px
    image (1025 tokens), no recompute; M = batch / (DP x 2). Optimus trains everything;
    ``trainable=False`` gives the Cornstarch freezing on the same models."""
    freeze = dict(freeze_encoders=False, freeze_llm=False) if trainable else {}
    layouts = {"Optimus-A": (4, 8, 8), "Optimus-B": (4, 8, 8), "Optimus-C": (8, 8, 16),
               "Optimus-D": (8, 8, 32)}  # (PP, TP, M); D: 1536 GPUs, batch 1536, DP 24
    return [Scenario(pair=name, pipeline_model_parallel_size=pp, tensor_model_parallel_size=tp,
                     num_microbatches=m, micro_batch_size=2, text_tokens=2048 - 1025,
                     recompute=False, img_h=448, img_w=448, **{**freeze, **overrides})
            for name, (pp, tp, m) in layouts.items()]
