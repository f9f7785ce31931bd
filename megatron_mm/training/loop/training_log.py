"""Megatron-LM's iteration line (``training_log``), its timers and its memory report.

The line's fields and their formats are Megatron-LM's: ``lm loss`` is the mean over the
log interval's advanced (not skipped) iterations, ``elapsed time per iteration (ms)`` and
``throughput per GPU (TFLOP/s/GPU)`` come from the ``interval-time`` timer, ``loss scale``
is the optimizer's. ``tokens per second`` (ours) counts the real, non-padding tokens of
all data-parallel ranks. Losses, gradient norms and the loss scale stay on the device
between log intervals (``--log-interval``; TensorBoard's ``--tensorboard-log-interval``)
and are read there, the interval's together: no host sync in between.
"""

from __future__ import annotations

import math
import resource
from datetime import datetime
from typing import Callable, Dict, Optional, Tuple

import torch
from megatron.core import parallel_state
from megatron.core.optimizer.clip_grads import get_grad_norm_fp32
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared

from .step import StepResult, read_on_host

# Megatron-LM's timer names by --timing-log-level (training.py: training_log).
TIMERS_LEVEL_1 = [
    "forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce",
    "all-grads-sync", "params-all-gather", "optimizer-copy-to-main-grad",
    "optimizer-unscale-and-check-inf", "optimizer-clip-main-grad", "optimizer-count-zeros",
    "optimizer-inner-step", "optimizer-copy-main-to-model-params", "optimizer",
]
TIMERS_LEVEL_2 = [
    "batch-generator", "forward-compute", "backward-compute", "forward-recv", "forward-send",
    "backward-recv", "backward-send", "forward-send-forward-recv",
    "forward-send-backward-recv", "backward-send-forward-recv",
    "backward-send-backward-recv", "forward-backward-send-forward-backward-recv",
]


def timers_to_log(level: int) -> list:
    return (TIMERS_LEVEL_1 if level >= 1 else []) + (TIMERS_LEVEL_2 if level >= 2 else [])


def memory_report(name: str) -> str:
    """Megatron-LM's ``report_memory`` line; on a machine without CUDA, the process's
    peak resident memory instead (all there is to report)."""
    mb = 1024.0 * 1024.0
    if torch.cuda.is_available():
        return (f"{name} memory (MB) | allocated: {torch.cuda.memory_allocated() / mb:.2f}"
                f" | max allocated: {torch.cuda.max_memory_allocated() / mb:.2f}"
                f" | reserved: {torch.cuda.memory_reserved() / mb:.2f}"
                f" | max reserved: {torch.cuda.max_memory_reserved() / mb:.2f}")
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: kilobytes
    return f"{name} memory (MB) | max resident (host, no CUDA): {peak_kb / 1024:.2f}"


def report_memory(name: str) -> None:
    """Printed by data-parallel rank 0 of each model-parallel rank, as Megatron-LM does."""
    if parallel_state.get_data_parallel_rank() == 0:
        print(f"[Rank {torch.distributed.get_rank()}] {memory_report(name)}", flush=True)


def params_l2_norm(model_chunks) -> float:
    """``--log-params-norm``: each parameter counted once (not TP duplicates, not shared
    copies), over the model-parallel group; data-parallel replicas hold the same values."""
    tp_group = parallel_state.get_tensor_model_parallel_group()
    params = [p.data.float() for chunk in model_chunks for p in chunk.parameters()
              if param_is_not_shared(p)
              and param_is_not_tensor_parallel_duplicate(p, tp_group=tp_group)]
    return float(get_grad_norm_fp32(params, 2.0, parallel_state.get_model_parallel_group()))


class TrainingLog:
    """Accumulates one log interval and prints Megatron-LM's iteration line on the last
    rank (``config``: the RunConfig). ``writers`` (TensorBoard / wandb, last rank only) get
    Megatron's scalars."""

    def __init__(self, config, timers, flops_per_iteration: float,
                 count_tokens: Callable[[], int], writers=None,
                 print_fn: Callable[[str], None] = print):
        self.config, self.timers, self.writers = config, timers, writers
        self.flops_per_iteration = flops_per_iteration
        self.count_tokens, self.print = count_tokens, print_fn
        self.pending: Dict[int, StepResult] = {}  # not yet read on the host
        self._reset()

    def _reset(self) -> None:
        self.loss_sum, self.advanced, self.skipped, self.nan = 0.0, 0, 0, 0
        self.moe_sums: Dict[str, torch.Tensor] = {}  # an MoE LLM's metrics over the interval

    def read(self) -> Dict[int, Tuple[float, float]]:
        """The pending iterations' (lm loss, grad norm) on the host (loss NaN off the last
        stage, norm None when the optimizer gave none), in one read; counted into the
        interval."""
        pending, self.pending = self.pending, {}
        values = read_on_host([v for r in pending.values() for v in (r.lm_loss, r.grad_norm)])
        read = {}
        for k, (it, result) in enumerate(pending.items()):
            loss = values[2 * k]
            grad_norm = None if result.grad_norm is None else values[2 * k + 1]
            if result.update_successful:
                if result.lm_loss is not None:  # a loss only on the last pipeline stage
                    self.loss_sum += loss
            else:
                self.nan += int(not math.isfinite(loss))
            read[it] = (loss, grad_norm)
        return read

    def record(self, iteration: int, result: StepResult, learning_rate: float,
               loss_scale: Callable[[], torch.Tensor], model_chunks,
               moe: Optional[Dict[str, torch.Tensor]] = None,
               module_lrs: Optional[Dict[str, float]] = None) -> Dict[int, Tuple]:
        """One iteration; at a log interval, the line. Returns what it read on the host:
        {iteration: (lm loss, grad norm)} of the interval at a log interval, else {}.
        ``moe``: an MoE LLM's metrics of the step (``moe_metrics.MoEMetrics.report``);
        ``module_lrs``: module -> its group's learning rate (``--vision-lr`` ...)."""
        log, train = self.config.logging, self.config.training
        self.pending[iteration] = result
        for key, value in (moe or {}).items():  # device tensors: summed there
            self.moe_sums[key] = value + self.moe_sums[key] if key in self.moe_sums else value
        if result.update_successful:
            self.advanced += 1
        else:
            self.skipped += 1
        tensorboard = self.writers is not None and iteration % log.tensorboard_log_interval == 0
        logging = iteration % log.log_interval == 0
        params_norm = (params_l2_norm(model_chunks)
                       if log.log_params_norm and (logging or tensorboard) else None)
        consumed = iteration * train.global_batch_size
        read = self.read() if logging else {}
        if tensorboard:
            loss, grad_norm = read[iteration] if logging else read_on_host(
                [result.lm_loss, result.grad_norm])
            self._write(iteration, consumed, loss, None if result.grad_norm is None
                        else grad_norm, result.num_zeros_in_grad, params_norm,
                        learning_rate, float(loss_scale()),  # a TensorBoard interval
                        module_lrs or {})
        if not logging:
            return read
        grad_norm, num_zeros = read[iteration][1], result.num_zeros_in_grad
        elapsed = self.timers("interval-time").elapsed(barrier=True)
        per_iteration = elapsed / max(1, self.advanced + self.skipped)
        tokens = self.count_tokens()
        # every GPU of the job, as Megatron-LM's args.world_size: under --encoder-schedule
        # separate the encoder ranks too (the parallel config's world is the LLM's there)
        world_size = torch.distributed.get_world_size()
        throughput = self.flops_per_iteration / (per_iteration * 1e12 * world_size)
        line = f" [{datetime.now():%Y-%m-%d %H:%M:%S.%f}]"
        line += f" iteration {iteration:8d}/{train.train_iters:8d} |"
        line += f" consumed samples: {consumed:12d} |"
        line += f" elapsed time per iteration (ms): {per_iteration * 1000.0:.1f} |"
        if log.log_throughput:
            line += f" throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |"
        line += f" tokens per second: {tokens / elapsed:.1f} |"
        line += f" learning rate: {learning_rate:.6E} |"
        for module, lr in (module_lrs or {}).items():  # as Megatron-LM's decoupled rate
            line += f" {module} learning rate: {lr:.6E} |"
        line += f" global batch size: {train.global_batch_size:5d} |"
        if self.advanced and parallel_state.is_pipeline_last_stage():
            line += f" lm loss: {self.loss_sum / self.advanced:.6E} |"
        steps = max(1, self.advanced + self.skipped)
        for key, value in self.moe_sums.items():  # Megatron-LM's total_loss_dict format
            if value.dim():  # tokens per expert
                counts = "/".join(str(int(v) // steps) for v in value.tolist())
                line += f" tokens per expert: {counts} |"
            else:
                line += f" {key}: {float(value) / steps:.6E} |"
        line += f" loss scale: {float(loss_scale()):.1f} |"
        if grad_norm is not None:
            line += f" grad norm: {grad_norm:.3f} |"
        if num_zeros is not None:
            line += f" num zeros: {int(num_zeros)} |"
        if params_norm is not None:
            line += f" params norm: {params_norm:.3f} |"
        line += f" number of skipped iterations: {self.skipped:3d} |"
        line += f" number of nan iterations: {self.nan:3d} |"
        self.print(line)
        if self.writers is not None and log.log_timers_to_tensorboard:
            self.writers.add_scalar("iteration-time", per_iteration, iteration)
            self.writers.add_scalar("throughput", throughput, iteration)
        names = timers_to_log(log.timing_log_level)
        if names:
            if self.writers is not None and log.log_timers_to_tensorboard:
                self.timers.write(names, self.writers, iteration,
                                  normalizer=log.log_interval, reset=False)
            # Timers.log would go to a logger nobody configured; print as Megatron-LM shows it
            timing = self.timers.get_all_timers_string(names, normalizer=log.log_interval)
            if timing:
                self.print(timing)
        self._reset()
        return read

    def _write(self, iteration, consumed, loss, grad_norm, num_zeros, params_norm,
               learning_rate, loss_scale, module_lrs) -> None:
        """Megatron-LM's TensorBoard scalars: each by iteration and '... vs samples'
        (a module's own rate as 'vision-learning-rate', like 'decoupled-learning-rate')."""
        log, train, w = self.config.logging, self.config.training, self.writers
        scalars = {"learning-rate": learning_rate,
                   **{f"{m}-learning-rate": lr for m, lr in module_lrs.items()},
                   "batch-size": train.global_batch_size}
        if not math.isnan(loss):
            scalars["lm loss"] = loss
        if log.log_loss_scale_to_tensorboard:
            scalars["loss-scale"] = loss_scale
        if log.log_world_size_to_tensorboard:
            scalars["world-size"] = self.config.parallel.world_size
        for name, value in (("grad-norm", grad_norm), ("num-zeros", num_zeros),
                            ("params-norm", params_norm)):
            if value is not None:
                scalars[name] = float(value)
        for name, value in scalars.items():
            w.add_scalar(name, value, iteration)
            w.add_scalar(name + " vs samples", value, consumed)
        if log.log_memory_to_tensorboard and torch.cuda.is_available():
            stats = torch.cuda.memory_stats()
            for name, key in (("mem-reserved-bytes", "reserved_bytes.all.current"),
                              ("mem-allocated-bytes", "allocated_bytes.all.current"),
                              ("mem-max-allocated-bytes", "allocated_bytes.all.peak"),
                              ("mem-allocated-count", "allocation.all.current")):
                w.add_scalar(name, stats[key], iteration)


def validation_scalars(writers, iteration: int, consumed: int, loss: float,
                       accuracy: Optional[float], log_ppl: bool) -> None:
    """Megatron-LM's 'lm loss validation' (and its ppl) plus our answer accuracy."""
    if writers is None:
        return
    values = {"lm loss validation": loss}
    if log_ppl:
        values["lm loss validation ppl"] = math.exp(min(20.0, loss))
    if accuracy is not None:
        values["val answer accuracy"] = accuracy
    for name, value in values.items():
        writers.add_scalar(name, value, iteration)
        writers.add_scalar(name + " vs samples", value, consumed)
