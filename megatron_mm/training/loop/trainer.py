"""One typed training state: the ``Trainer`` built once from the validated flags.

It holds what a run derives: the tokenizer, the model config with its real vocabulary, the
plan (computed once, before any process group: a plan that cannot work is reported
first), the encoder replicas' groups, the attention settings, the schedule executor, the
datasets, the model chunks, optimizer, scheduler, timers and metric writers. The argparse
namespace stays what the user typed (plus Megatron's derived sizes) and is never written
to: the run reads the typed RunConfig of it, with the plan's encoder schedule
(``TrainingPlan.run_config``).
The pieces it is built from are the run's context (``run_context.py``: attention,
tokenizer, model config, plan, as every entry point builds them), the data set-up
(``data_setup.py``) and the model and optimizer set-up (``model_setup.py``).
``train()`` is Megatron-LM's loop: step, log, evaluate, then save and decide to exit
(``--exit-interval``, ``--exit-duration-in-mins``, ``--exit-signal-handler``).
"""

from __future__ import annotations

import math
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from megatron.core import parallel_state
from megatron.core.timers import Timers

from ...data.item_tags import describe as describe_tags
from ...models import model_chain
from ...models.attention_backends import attention_backend_lines
from ...models.linear_attention import describe_linear_attention
from ..assembly.attention import AttentionSettings
from ..checkpoint.checkpointing import (load_checkpoint, locate_checkpoint, save_checkpoint,
                                        saved_pipeline_plan)
from .encoder_executor import build_executor
from .evaluation import answer_accuracy, evaluate_loss
from .validation_samples import samples_lines, samples_text
from ...runtime.collective_device import collective_device
from ..assembly.initialize import initialize_distributed, set_random_seed
from ..config.logging_args import validation_enabled
from .metric_writers import build_writers
from .nan_check import check_losses
from ..planning.partition_trials import search_partition
from ...data.loaders import savable
from ..assembly.build_settings import fusions, transformer_impl
from ..assembly.data_setup import batch_iterators, build_datasets, tensor_parallel_batches
from ..assembly.model_setup import build_model_chunks, force_param_sync, setup_model_and_optimizer
from ..assembly.module_lr import module_learning_rates
from ..config.module_lr_args import module_rates
from .moe_metrics import moe_metrics, read_moe
from ..rank_print import print_rank_0, print_rank_last
from ..config.run_config import RunConfig
from ..separate.run import SeparateRun, build_separate_run
from ...runtime.separate_executor import global_grad_norm
from .signal_handler import DistributedSignalHandler
from .step import TokenCounter, train_step
from .training_log import TrainingLog, report_memory, validation_scalars
from ..planning.training_plan import TrainingPlan, plan_pipeline
from ..run_context import RunContext, model_config_for, tokenizer_from_config  # noqa: F401


def model_flops_per_iteration(config, model_config) -> float:
    """Forward and backward FLOPs of one global batch: every layer of the encoders,
    projectors and LLM at the run's shapes (frozen layers without their weight
    gradients), as Megatron-LM's formula counts the model, not recompute."""
    train = config.training
    chain = model_chain(model_config, config.model.seq_length, train.micro_batch_size, 1)
    per_micro_batch = sum(layer.fwd_flops + layer.bwd_flops for layer in chain)
    return per_micro_batch * train.num_microbatches * config.parallel.data_parallel_size


@dataclass
class TrainingCallbacks:
    """Hooks into the loop (tests use them to watch the model and read gradients)."""

    on_model_built: Optional[Callable] = None  # (chunks, wrapped chunks, optimizer)
    # (iteration, chunks, the lm loss on the device: None off the last stage), before
    # grads are cleared
    on_step: Optional[Callable] = None


@dataclass
class Trainer:
    config: RunConfig  # the validated flags, typed, with the plan's encoder schedule
    tokenizer: object
    model_config: object  # with the tokenizer's vocabulary
    plan: TrainingPlan
    encoder_replicas: object  # an encoder TP below the LLM's: its groups; else None
    attention: AttentionSettings
    executor: Optional[Callable]  # --encoder-schedule coarse|bubble|separate; else
    # Megatron-Core's
    train_ds: object
    valid_ds: object
    model: list  # this rank's chunks
    model_chunks: list  # the same, wrapped (DDP, Float16Module)
    optimizer: object
    scheduler: object
    timers: Timers
    writers: object = None  # TensorBoard / wandb on the last rank
    data_state: object = None  # Energon's loader, whose state checkpoints carry
    # --exit-duration-in-mins counts from the start of the build, setup included, as
    # Megatron-LM's _TRAIN_START_TIME does (a job's time limit counts it too)
    started: float = field(default_factory=time.time)
    summary: dict = field(default_factory=dict)

    @classmethod
    def build(cls, config: RunConfig) -> "Trainer":
        started = time.time()
        # attention, tokenizer, model config and plan, before any process group
        run = RunContext.build(config)
        config, tokenizer, model_config, plan = (run.config, run.tokenizer, run.model_config,
                                                 run.plan)
        cp, attention = run.cp, run.attention
        replicas = initialize_distributed(config.parallel, config.encoder_schedule)
        print_rank_0("> " + describe_tags(tokenizer.item_tags, tokenizer.missing_tags,
                                          tokenizer.tag_request))
        set_random_seed(config.training.seed)
        writers = build_writers(config)  # a missing package fails before the model is built
        train_ds, valid_ds = build_datasets(config, tokenizer)
        print_rank_0(f"> LLM attention: {cp.reason}")
        if model_config.language.linear_attention is not None:
            print_rank_0(f"> {describe_linear_attention(model_config.language)}")
        if config.fp8_settings is not None:
            print_rank_0(f"> {config.fp8_settings.describe()}")
        print_rank_0(f"> building multimodal model ({transformer_impl(config.model)} "
                     f"specs), {len(train_ds)} train / {len(valid_ds)} validation samples ...")
        print_rank_0(f"> {fusions(config).describe()}")
        timers = Timers(config.logging.timing_log_level, config.logging.timing_log_option)

        def build_run(run_plan):
            chunks = build_model_chunks(config, tokenizer, model_config, run_plan, replicas)
            return (chunks,) + setup_model_and_optimizer(config, chunks, timers)

        resumed = (saved_pipeline_plan(config.checkpoint, config.parallel)
                   if config.pipeline.pipeline_partition == "search" else None)
        if resumed is not None:  # the checkpoint's pick: its optimizer state is tied to it
            print_rank_0(f"> --pipeline-partition search: the checkpoint's partition "
                         f"{','.join(map(str, resumed))}, not searched again")
            plan = plan_pipeline(config, model_config, resumed, "search", plan.schedule)
        elif config.pipeline.pipeline_partition == "search":
            best = search_partition(
                config, plan.chain,
                build=lambda layers: build_run(plan_pipeline(
                    config, model_config, layers, "search trial", plan.schedule))[1:],
                batches=lambda: batch_iterators(config, train_ds, tokenizer, 0, shuffle=True),
                step=lambda run, data: train_step(config, run[0], run[1], run[2], data,
                                                  attention=attention),
                reseed=lambda: set_random_seed(config.training.seed), log=print_rank_0)
            plan = plan_pipeline(config, model_config, best, "search", plan.schedule)
        description = plan.describe(config)
        if description:
            print_rank_0(description)
        executor = (build_executor(config, plan.encoder_plan, plan.chain, replicas, attention)
                    if plan.encoder_plan is not None else
                    build_separate_run(config, plan, attention) if plan.separate is not None
                    else None)
        model, model_chunks, optimizer, scheduler = build_run(plan)
        if plan.separate is not None:  # both sides clip by the norm of every parameter
            global_grad_norm(optimizer)
        for line in attention_backend_lines(
                model, config.training.micro_batch_size, config.model.seq_length,
                torch.bfloat16 if config.training.bf16 else torch.float32) or ():
            print_rank_0(f"> attention backend of {line}")
        n_params = sum(p.numel() for chunk in model for p in chunk.parameters())
        n_train = sum(p.numel() for chunk in model for p in chunk.parameters()
                      if p.requires_grad)
        print_rank_0(f" > number of parameters on (tensor, pipeline) model parallel rank "
                     f"({parallel_state.get_tensor_model_parallel_rank()}, "
                     f"{parallel_state.get_pipeline_model_parallel_rank()}): {n_params} "
                     f"({n_train} trainable)")
        return cls(config, tokenizer, model_config, plan, replicas, attention, executor,
                   train_ds, valid_ds, model, model_chunks, optimizer, scheduler, timers,
                   writers, started=started)

    # -- data: the one place iterators are built ------------------------------------------
    def batches(self, dataset, consumed_samples: int, shuffle: bool):
        """The iterator the schedule takes (one per model chunk with virtual stages), read
        on the first tensor-parallel rank of each stage (``tensor_parallel_batches``)."""
        if isinstance(self.executor, SeparateRun):
            return batch_iterators(self.config, dataset, self.tokenizer, consumed_samples,
                                   shuffle, replicas=self.executor.replicas)
        return tensor_parallel_batches(
            self.config, self.plan, lambda: batch_iterators(
                self.config, dataset, self.tokenizer, consumed_samples, shuffle),
            self.config.parallel.virtual_pipeline_model_parallel_size)

    # -- checkpoints -------------------------------------------------------------------------
    def run_state(self) -> dict:
        """What the run derived, saved with the flags in the checkpoint."""
        return {"padded_vocab_size": self.model_config.language.vocab_size_padded(
                    self.config.parallel.tensor_model_parallel_size),
                "pipeline_plan": self.plan.to_checkpoint()}

    def save(self, iteration: int) -> None:
        force_param_sync(self.config, self.model_chunks, self.optimizer)
        save_checkpoint(self.config, iteration, self.model, self.optimizer, self.scheduler,
                        self.model_config, self.run_state(), self.data_state)
        print_rank_0(f"  successfully saved checkpoint at iteration {iteration} to "
                     f"{self.config.checkpoint.save}")

    def load(self) -> int:
        load = self.config.checkpoint.load
        if not load:
            return 0
        found = locate_checkpoint(self.config.checkpoint)  # None: a fresh auto-resume
        iteration = load_checkpoint(self.config, self.model, self.optimizer, self.scheduler,
                                    log=print_rank_0, run_state=self.run_state())
        if found is not None:  # iteration 0 too (a converted checkpoint)
            print_rank_0(f" > loaded checkpoint from {load} at iteration {iteration}")
        return iteration

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, iteration: int, label: str = "") -> dict:
        config, gbs = self.config, self.config.training.global_batch_size
        force_param_sync(config, self.model_chunks, self.optimizer)
        batches = self.batches(self.valid_ds, 0, shuffle=False)
        loss = evaluate_loss(config, self.model_chunks, batches, self.executor, self.attention)
        n = min(len(self.valid_ds), config.validation.eval_iters * gbs)
        line = (f" validation loss at iteration {iteration}{label} | lm loss value: "
                f"{loss:.6E} | lm loss PPL: {math.exp(min(20.0, loss)):.6E} |")
        accuracy, shown = None, []
        if config.validation.eval_max_new_tokens > 0:  # 0: no greedy decoding
            accuracy = answer_accuracy(config, self.model_chunks, self.valid_ds,
                                       self.tokenizer, range(n), self.executor, self.attention,
                                       shown)
            line += f" val answer accuracy: {accuracy:.4f} ({n} samples) |"
        print_rank_last("-" * len(line) + "\n" + line + "\n" + "-" * len(line))
        if shown:  # --log-validation-samples
            print_rank_last(samples_lines(shown, iteration, label))
            if self.writers is not None:
                self.writers.add_text("validation samples", samples_text(shown), iteration)
        validation_scalars(self.writers, iteration, iteration * gbs, loss, accuracy,
                           config.logging.log_validation_ppl_to_tensorboard)
        self.summary.setdefault("val_losses", {})[iteration] = loss  # every evaluation's
        return {"val_loss": loss, "val_accuracy": accuracy}

    # -- the loop ----------------------------------------------------------------------------
    def take_read(self, read: dict) -> None:
        """Losses and gradient norms read on the host (``TrainingLog``: at log intervals
        and at the end) into the summary; with --check-for-nan-in-loss-and-grad every
        rank stops at the first non-finite loss among them."""
        if not read:  # not a log interval (the same on every rank)
            return
        self.summary["losses"].update({it: loss for it, (loss, _) in read.items()})
        self.summary["grad_norms"].update({it: norm or 0.0 for it, (_, norm) in read.items()})
        if self.config.exits.check_for_nan_in_loss_and_grad:
            check_losses({it: loss for it, (loss, _) in read.items()}
                         if self.holds_loss() else {})

    def holds_loss(self) -> bool:
        """Whether this rank computes the lm loss: the LLM's last stage (an encoder rank
        of --encoder-schedule separate is the last stage of a grid of its own)."""
        encoder = isinstance(self.executor, SeparateRun) and self.executor.encoder
        return parallel_state.is_pipeline_last_stage() and not encoder

    def exit_reason(self, iteration: int, handler, start: float) -> Optional[str]:
        """Megatron-LM's checkpoint_and_decide_exit: every rank takes the same decision."""
        config = self.config
        if handler is not None and handler.any_received():
            return f"after receiving {config.exits.exit_signal}"
        if config.exits.exit_duration_in_mins:
            minutes = (time.time() - start) / 60.0
            done = torch.tensor([int(minutes > config.exits.exit_duration_in_mins)],
                                device=collective_device())
            torch.distributed.all_reduce(done, op=torch.distributed.ReduceOp.MAX)
            if done.item():
                return f"after {minutes:.2f} minutes"
        if config.exits.exit_interval and iteration % config.exits.exit_interval == 0:
            return f"at iteration {iteration} (--exit-interval {config.exits.exit_interval})"
        return None

    def train(self, callbacks: Optional[TrainingCallbacks] = None) -> dict:
        """Train as the flags say; returns a summary (losses per iteration, last
        evaluation, and ``exit`` when the run stopped early)."""
        config, callbacks = self.config, callbacks or TrainingCallbacks()
        if callbacks.on_model_built is not None:
            callbacks.on_model_built(self.model, self.model_chunks, self.optimizer)
        iteration = self.load()
        train_iter = self.batches(self.train_ds, iteration * config.training.global_batch_size,
                                  shuffle=True)
        self.data_state = savable(train_iter)  # Energon's loader: saved with checkpoints
        if isinstance(train_iter, list):  # count the tokens of one chunk's copy of the data
            train_iter[0] = counter = TokenCounter(train_iter[0])
        else:
            train_iter = counter = TokenCounter(train_iter)
        log = TrainingLog(config, self.timers, model_flops_per_iteration(config, self.model_config),
                          counter.take_global, self.writers, print_rank_last)
        summary = self.summary
        summary.update(losses={}, grad_norms={})
        moe = moe_metrics(config, self.model_chunks)
        if moe is not None:
            summary["moe_losses"] = {}
        validate = validation_enabled(config.validation)
        rates = module_rates(config.training)  # --vision-lr ...: logged with --lr's
        handler = (DistributedSignalHandler(getattr(signal, config.exits.exit_signal))
                   if config.exits.exit_signal_handler else None)
        start, first, last_saved, stop = self.started, iteration + 1, None, None
        with handler or nullcontext():
            self.timers("interval-time", log_level=0).start(barrier=True)
            while iteration < config.training.train_iters:
                result = train_step(config, self.model_chunks, self.optimizer, self.scheduler,
                                    train_iter, self.executor, self.attention, self.timers,
                                    iteration=iteration + 1)
                iteration += 1
                if callbacks.on_step is not None:
                    callbacks.on_step(iteration, self.model, result.lm_loss)
                moe_step = None if moe is None else moe.report(iteration, self.writers)
                if moe_step is not None:
                    summary["moe_losses"][iteration] = moe_step
                read = log.record(
                    iteration, result, self.scheduler.get_lr(self.optimizer.param_groups[0]),
                    self.optimizer.get_loss_scale, self.model_chunks, moe_step,
                    module_learning_rates(self.optimizer, rates, config.training))
                self.take_read(read)
                if read and moe is not None:  # a log interval: read on the host now
                    summary["moe_losses"] = read_moe(summary["moe_losses"])
                if iteration == first:  # after the optimizer state exists
                    report_memory(f"(after {iteration} iterations)")
                if validate and iteration % config.validation.eval_interval == 0 and \
                        iteration < config.training.train_iters:
                    self.timers("interval-time").stop()
                    summary.update(self.evaluate(iteration))
                    self.timers("interval-time").start(barrier=True)
                stop = self.exit_reason(iteration, handler, start)
                if config.checkpoint.save and (stop or (config.checkpoint.save_interval
                                           and iteration % config.checkpoint.save_interval == 0)):
                    self.timers("interval-time").stop()  # saving is not step time
                    self.save(iteration)
                    last_saved = iteration
                    self.timers("interval-time").start(barrier=True)
                if stop:
                    print_rank_0(f" exiting program {stop}")
                    break
            self.timers("interval-time").stop()
        force_param_sync(config, self.model_chunks, self.optimizer)  # the model as left
        self.take_read(log.read())  # the iterations since the last log interval
        if stop is None:
            if config.checkpoint.save and last_saved != iteration:
                self.save(iteration)
            if validate and not config.validation.skip_final_eval:
                summary.update(self.evaluate(iteration, label=" on validation set"))
        else:
            summary["exit"] = stop
        if self.writers is not None:
            self.writers.close()
        if moe is not None:
            summary["moe_losses"] = read_moe(summary["moe_losses"])
        summary["iteration"] = iteration
        summary["pipeline_partition"] = list(self.plan.partition.layers_per_chunk)
        return summary
