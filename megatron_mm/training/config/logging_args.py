"""Megatron-LM's flags for logging, timing, clean exits and NaN checks, with its names and
defaults (``megatron/training/config``: ``LoggerConfig``, ``TrainingConfig``). No torch."""

from __future__ import annotations

import argparse
import signal

from ...config import ConfigError

EXIT_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")


def logging_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("exits and checks")
    g.add_argument("--exit-interval", type=int, default=None,
                   help="exit the program after the iteration is divisible by this value "
                        "(saving first with --save)")
    g.add_argument("--exit-duration-in-mins", type=int, default=None,
                   help="exit the program after this many minutes, setup included (saving first "
                        "with --save); every rank takes the same decision")
    g.add_argument("--exit-signal-handler", action="store_true",
                   help="on --exit-signal (SIGTERM), finish the iteration, save the "
                        "checkpoint and exit cleanly; all ranks agree on the iteration")
    g.add_argument("--exit-signal", choices=EXIT_SIGNALS, default="SIGTERM",
                   help="the signal --exit-signal-handler watches")
    g.add_argument("--check-for-nan-in-loss-and-grad", action="store_true", default=True,
                   help="stop the run, naming the iteration, when the loss or a gradient is "
                        "NaN or Inf (on by default, as in Megatron-LM)")
    g.add_argument("--no-check-for-nan-in-loss-and-grad", action="store_false",
                   dest="check_for_nan_in_loss_and_grad")

    g = p.add_argument_group("logging")
    g.add_argument("--log-params-norm", action="store_true",
                   help="calculate and log the parameters' L2 norm")
    g.add_argument("--log-num-zeros-in-grad", action="store_true",
                   help="calculate and log the number of zeros in the gradient")
    g.add_argument("--log-throughput", action="store_true",
                   help="calculate and log throughput per GPU (TFLOP/s/GPU) from the model's "
                        "FLOPs, encoders and projectors included")
    g.add_argument("--timing-log-level", type=int, choices=[0, 1, 2], default=0,
                   help="0: iteration time only; 1: once-per-iteration operations "
                        "(forward-backward, optimizer, ...); 2: per-micro-batch ones too "
                        "(forward-compute, backward-compute, p2p). Timers synchronise the "
                        "device")
    g.add_argument("--timing-log-option", choices=["max", "minmax", "all"], default="minmax",
                   help="report the max, the min and max, or every rank's time")
    g.add_argument("--no-barrier-with-level-1-timing", action="store_false",
                   dest="barrier_with_L1_time",
                   help="level-1 timers start without a barrier")
    g.add_argument("--tensorboard-dir", default=None,
                   help="write TensorBoard event files to this directory (needs the "
                        "tensorboard package)")
    g.add_argument("--tensorboard-log-interval", type=int, default=1,
                   help="report to TensorBoard every this many iterations")
    g.add_argument("--tensorboard-queue-size", type=int, default=1000,
                   help="pending events before an add call flushes them to disk")
    g.add_argument("--log-timers-to-tensorboard", action="store_true",
                   help="write the timers (and iteration-time, throughput) to TensorBoard")
    g.add_argument("--no-log-loss-scale-to-tensorboard", action="store_false",
                   dest="log_loss_scale_to_tensorboard")
    g.add_argument("--log-validation-ppl-to-tensorboard", action="store_true",
                   help="write the validation perplexity to TensorBoard")
    g.add_argument("--log-validation-samples", type=int, default=0, metavar="N",
                   help="at each evaluation, N validation questions with the model's greedy "
                        "answer and the reference, in the log and as TensorBoard / wandb text "
                        "(needs --eval-max-new-tokens above 0)")
    g.add_argument("--log-memory-to-tensorboard", action="store_true",
                   help="write the device memory statistics to TensorBoard")
    g.add_argument("--log-world-size-to-tensorboard", action="store_true")
    g.add_argument("--wandb-project", default=None,
                   help="the Weights & Biases project (needs the wandb package; "
                        "WANDB_MODE=offline works without network)")
    g.add_argument("--wandb-exp-name", default=None, help="the wandb experiment name")
    g.add_argument("--wandb-save-dir", default=None,
                   help="where wandb writes its files (default: <--save>/wandb)")
    g.add_argument("--wandb-entity", default=None)


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
