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
