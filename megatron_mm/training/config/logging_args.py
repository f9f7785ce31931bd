"""Megatron-LM's flags for logging, timing, clean exits and NaN checks, with its names and
defaults (``megatron/training/config``: ``LoggerConfig``, ``TrainingConfig``). No torch."""

from __future__ import annotations

from ...config import ConfigError

EXIT_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")


def validate_logging_args(config) -> None:
    """The logging flags that need other groups' (``config``: the RunConfig; each group's
    own: ``LoggingArgs.errors``, ``ExitsArgs.errors``)."""
    logging = config.logging
    # Megatron-LM: "Please specify the wandb experiment name!"
    if logging.wandb_project is not None:
        if not logging.wandb_exp_name:
            raise ConfigError("--wandb-project needs --wandb-exp-name (the run's name)")
        if logging.wandb_save_dir is None and config.checkpoint.save is None:
            raise ConfigError("--wandb-project needs --wandb-save-dir or --save (wandb "
                              "writes to <--save>/wandb)")
    if logging.log_validation_samples and not config.validation.eval_max_new_tokens:
        raise ConfigError("--log-validation-samples shows greedy answers: it needs "
                          "--eval-max-new-tokens above 0")


def validation_enabled(validation) -> bool:
    """Megatron-LM: ``--eval-iters 0`` skips validation."""
    return validation.eval_iters > 0
