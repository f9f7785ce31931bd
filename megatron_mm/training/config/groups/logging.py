"""The iteration line, its metrics and where they are written."""

from dataclasses import dataclass
from typing import List, Literal, Optional

from ....config import ConfigError
from .fields import flag, not_positive


@dataclass(frozen=True)
class LoggingArgs:
    """The iteration line, its metrics and where they are written."""

    log_interval: int = 10
    log_params_norm: bool = False
    """calculate and log the parameters' L2 norm"""
    log_num_zeros_in_grad: bool = False
    """calculate and log the number of zeros in the gradient"""
    log_throughput: bool = False
    """calculate and log throughput per GPU (TFLOP/s/GPU) from the model's FLOPs, encoders and
    projectors included"""
    timing_log_level: Literal[0, 1, 2] = 0
    """0: iteration time only; 1: once-per-iteration operations (forward-backward, optimizer, ...);
    2: per-micro-batch ones too (forward-compute, backward-compute, p2p). Timers synchronise the
    device"""
    timing_log_option: Literal["max", "minmax", "all"] = "minmax"
    """report the max, the min and max, or every rank's time"""
    barrier_with_L1_time: bool = flag(True, arg_names=["--no-barrier-with-level-1-timing"])
    """level-1 timers start without a barrier"""
    tensorboard_dir: Optional[str] = None
    """write TensorBoard event files to this directory (needs the tensorboard package)"""
    tensorboard_log_interval: int = 1
    """report to TensorBoard every this many iterations"""
    tensorboard_queue_size: int = 1000
    """pending events before an add call flushes them to disk"""
    log_timers_to_tensorboard: bool = False
    """write the timers (and iteration-time, throughput) to TensorBoard"""
    log_loss_scale_to_tensorboard: bool = flag(
        True, arg_names=["--no-log-loss-scale-to-tensorboard"])
    log_validation_ppl_to_tensorboard: bool = False
    """write the validation perplexity to TensorBoard"""
    log_validation_samples: int = flag(0, metavar="N")
    """at each evaluation, N validation questions with the model's greedy answer and the reference,
    in the log and as TensorBoard / wandb text (needs --eval-max-new-tokens above 0)"""
    log_memory_to_tensorboard: bool = False
    """write the device memory statistics to TensorBoard"""
    log_world_size_to_tensorboard: bool = False
    wandb_project: Optional[str] = None
    """the Weights & Biases project (needs the wandb package; WANDB_MODE=offline works without
    network)"""
    wandb_exp_name: Optional[str] = None
    """the wandb experiment name"""
    wandb_save_dir: Optional[str] = None
    """where wandb writes its files (default: <--save>/wandb)"""
    wandb_entity: Optional[str] = None

    def errors(self) -> List[ConfigError]:
        """This group's own checks, each naming its flag (with the others:
        ``logging_args.validate_logging_args``)."""
        out = not_positive(self, "log_interval", "tensorboard_log_interval",
                           "tensorboard_queue_size")
        if self.log_validation_samples < 0:
            out.append(ConfigError("--log-validation-samples must not be negative"))
        return out
