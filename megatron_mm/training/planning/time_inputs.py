"""What the planner's time model reads of the run: the chain's cost unit (measured seconds of
``--pipeline-profile``, or the cost model's FLOPs) and the TP links. The encoder schedule
is generated on these, and ``--encoder-schedule auto`` simulates its alternatives on them.
"""

from __future__ import annotations

from ...plan.costs.hardware import Hardware, Interconnect
from ...plan.pipeline.profile import MEASURED, LayerProfile


def time_inputs(config) -> dict:
    """The time model's inputs besides the hardware and the encoder TP, as
    ``schedule_costs`` / ``megatron_costs`` take them: the TP links (a measured profile's
    ``tp_links``, else ``Interconnect``'s defaults: layer times are measured in one
    process, without TP traffic) and the run's TP (the chain's)."""
    links = None
    if config.pipeline.pipeline_profile:
        links = LayerProfile.load(config.pipeline.pipeline_profile).tp_links
    return dict(links=links or Interconnect(),
                tensor_model_parallel_size=config.parallel.tensor_model_parallel_size)


def hardware(pipeline) -> Hardware:
    """What the chain's costs are in: measured seconds, or FLOPs of the cost model."""
    return MEASURED if pipeline.pipeline_profile else Hardware()


def time_basis(pipeline) -> str:
    """What the simulated times rest on, for a person: the measured profile (its file and
    device) or the cost model's default hardware, named."""
    if pipeline.pipeline_profile:
        profile = LayerProfile.load(pipeline.pipeline_profile)
        return (f"the layer times measured in --pipeline-profile {pipeline.pipeline_profile} "
                f"(device {profile.device}, micro-batch {profile.micro_batch_size}, "
                f"sequence {profile.seq_length})")
    hw = Hardware()
    return (f"the cost model's default hardware, {hw.name} at {hw.efficiency:.0%} of "
            f"{hw.peak_flops / 1e12:g} TFLOP/s, not this machine (no --pipeline-profile; "
            f"tools/profile_layers.py measures one on it)")
