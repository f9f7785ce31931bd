"""The planner's chain of a training run: every layer of the encoders, projectors and LLM
at the run's shapes, its costs from the cost model or, with ``--pipeline-profile``, from
measured times. Every plan of the run (partition, recompute, encoder schedule) is made on it.
"""

from __future__ import annotations

from ...models import model_chain
from ...plan.profile import LayerProfile, apply_profile


def training_chain(args, model_config=None):
    """The chain of ``model_config`` (default: the flags', whose vocabulary the caller
    has set) at the run's shapes."""
    chain = model_chain(model_config or args.model_config, args.seq_length,
                        args.micro_batch_size, args.tensor_model_parallel_size)
    if getattr(args, "pipeline_profile", None):
        chain = apply_profile(chain, LayerProfile.load(args.pipeline_profile))
    return chain
