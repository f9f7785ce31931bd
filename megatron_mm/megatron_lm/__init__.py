"""The package in Megatron-LM's own training loop (``megatron.training.pretrain``): what a
Megatron-LM script needs, in Megatron-LM's contract.

    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()           # first: TE checked, CPU patches applied
    from megatron_mm import megatron_lm as mm

    args = parse_and_validate_args(extra_args_provider=mm.add_args)
    mm.check_args(args)               # a bad flag: one line from rank 0, exit status 2
    with mm.use_encoder_schedule():   # --encoder-schedule coarse | bubble in train_step
        pretrain(pretrain_cfg_container_from_args(args),
                 mm.train_valid_test_datasets_provider, ModelType.encoder_or_decoder,
                 mm.forward_step, mm.model_provider_for(my_gpt_provider))

See docs/megatron_lm.md (adopting it step by step) and docs/api.md (what is stable).
"""

from megatron_mm.startup import require_prepared

require_prepared(__name__)  # Megatron-Core imports follow

from .arguments import add_args, check_args, run_config_from_args, shared_flags  # noqa: E402
from .context import RunContext, run_context  # noqa: E402
from .datasets import train_valid_test_datasets_provider  # noqa: E402
from .forward_step import forward_step  # noqa: E402
from .model_provider import language_layer_spec, model_provider_for  # noqa: E402
from .schedules import EncoderSchedule, use_encoder_schedule  # noqa: E402

__all__ = ["EncoderSchedule", "RunContext", "add_args", "check_args", "forward_step",
           "language_layer_spec", "model_provider_for", "run_config_from_args", "run_context",
           "shared_flags", "train_valid_test_datasets_provider", "use_encoder_schedule"]
