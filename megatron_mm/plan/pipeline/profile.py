"""Measured per-layer times, fed to the planner in place of the FLOP cost model.

A profile holds, per chain module, the forward and backward seconds of one micro-batch,
measured on the real model (``tools/profile_layers.py``) under one freeze state and
workload. It also holds the activation bytes each layer saves for its backward (measured with
saved-tensor hooks), which replace the model's. ``apply_profile`` writes the times into
the chain's cost fields in seconds, so the
partitioner and the estimator run unchanged with ``MEASURED`` hardware (1 "FLOP" = 1 s).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from ..costs.hardware import Hardware, Interconnect
from ..errors import PlanError
from ..record import Record
from .layers import Layer

# Time model for chains whose costs are measured seconds.
MEASURED = Hardware(name="measured per-layer times", peak_flops=1.0, efficiency=1.0)


@dataclass
class LayerTime(Record):
    module: str
    forward_s: float
    backward_s: float  # 0 where no backward runs (frozen, nothing trainable upstream)
    # Bytes saved for backward (saved-tensor hooks) without and with recompute (the input);
    # None in profiles from before they were measured.
    act_bytes: Optional[float] = None
    recompute_act_bytes: Optional[float] = None


@dataclass
class LayerProfile(Record):
    device: str
    micro_batch_size: int
    seq_length: int
    tensor_model_parallel_size: int
    frozen: List[str]  # module roots whose parameters were frozen while measuring
    layers: List[LayerTime] = field(default_factory=list)
    # The links the run's TP all-reduces take (bus bandwidth, latency per collective):
    # layer times are measured in one process, without TP traffic, which the time model
    # (``unit_costs``) adds on these links; None: ``Interconnect``'s defaults.
    tp_links: Optional[Interconnect] = None

    def by_module(self) -> Dict[str, LayerTime]:
        return {t.module: t for t in self.layers}

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json(indent=1))

    @classmethod
    def load(cls, path: str) -> "LayerProfile":
        try:
            with open(path) as f:
                return cls.from_dict(json.load(f))
        except FileNotFoundError:
            raise PlanError(f"--pipeline-profile {path}: no such file") from None
        except (json.JSONDecodeError, TypeError) as e:
            raise PlanError(f"--pipeline-profile {path} is not a layer profile: {e}") from None


def apply_profile(chain: Sequence[Layer], profile: LayerProfile) -> List[Layer]:
    """The chain with measured seconds as its costs (backward as one part: the measured
    backward already is what this freeze state runs)."""
    times = profile.by_module()
    missing = [l.module for l in chain if l.module not in times]
    if missing:
        raise PlanError(f"the layer profile has no time for {len(missing)} modules of this "
                        f"model (first: {missing[0]}); profile the same model again")
    out = []
    for layer in chain:
        t = times[layer.module]
        if t.backward_s > 0 and not layer.runs_backward:
            raise PlanError(f"the layer profile measured a backward for {layer.module}, which "
                            "runs none under this run's freezing; profile with the same "
                            "--freeze-* flags")
        acts = {} if t.act_bytes is None else dict(
            act_bytes=t.act_bytes, recompute_act_bytes=t.recompute_act_bytes)
        out.append(dataclasses.replace(
            layer, **acts, fwd_flops=t.forward_s, recompute=False,
            dgrad_flops=0.0 if layer.trainable else t.backward_s,
            wgrad_flops=t.backward_s if layer.trainable else 0.0))
    return out
