"""Megatron-LM's flags for logging, timing, clean exits and NaN checks, with its names and
defaults (``megatron/training/config``: ``LoggerConfig``, ``TrainingConfig``). No torch."""

from __future__ import annotations

import argparse
import signal

from ...config import ConfigError

EXIT_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")


def validate_logging_args(args: argparse.Namespace) -> None:
    for flag in ("exit_interval", "exit_duration_in_mins", "tensorboard_log_interval",
                 "tensorboard_queue_size"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive")
    if args.wandb_project is not None:  # Megatron-LM: "Please specify the wandb experiment name!"
        if not args.wandb_exp_name:
            raise ConfigError("--wandb-project needs --wandb-exp-name (the run's name)")
        if args.wandb_save_dir is None and args.save is None:
            raise ConfigError("--wandb-project needs --wandb-save-dir or --save (wandb "
                              "writes to <--save>/wandb)")
    if args.log_validation_samples < 0:
        raise ConfigError("--log-validation-samples must not be negative")
    if args.log_validation_samples and not args.eval_max_new_tokens:
        raise ConfigError("--log-validation-samples shows greedy answers: it needs "
                          "--eval-max-new-tokens above 0")
    if args.exit_signal_handler and not hasattr(signal, args.exit_signal):
        raise ConfigError(f"--exit-signal {args.exit_signal} does not exist on this system")


def validation_enabled(validation) -> bool:
    """Megatron-LM: ``--eval-iters 0`` skips validation."""
    return validation.eval_iters > 0
