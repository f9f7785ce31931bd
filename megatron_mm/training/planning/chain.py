"""The planner's chain of a training run: every layer of the encoders, projectors and LLM
at the run's shapes, its costs from the cost model or, with ``--pipeline-profile``, from
measured times. Every plan of the run (partition, recompute, encoder schedule) is made on it.
"""

from __future__ import annotations

from ...models import model_chain
from ...plan.pipeline.profile import LayerProfile, apply_profile


def training_chain(config, model_config=None):
    """The chain of ``model_config`` (default: the flags', whose vocabulary the caller
    has set) at the run's shapes (``config``: the RunConfig)."""
    chain = model_chain(model_config or config.model_config, config.model.seq_length,
                        config.training.micro_batch_size,
                        config.parallel.tensor_model_parallel_size,
                        config.parallel.expert_model_parallel_size,
                        config.parallel.expert_tensor_parallel_size)
    if config.pipeline.pipeline_profile:
        chain = apply_profile(chain, LayerProfile.load(config.pipeline.pipeline_profile))
    return chain
