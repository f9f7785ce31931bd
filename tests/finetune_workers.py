"""A training worker for the fine-tuning tests (per-module rates, LoRA): ``train``'s
report plus the parameters the first step starts from (after ``--load``) and those after
it, and each module's learning rate the optimizer's groups held after every step."""

from __future__ import annotations

import os

from train_workers import full_state, norm_squares


def train_finetune(rank: int, argv: list, grad_steps=(1, 3)) -> dict:
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.module_lr import module_learning_rates
    from megatron_mm.training.config.module_lr_args import module_rates
    from megatron_mm.training.pretrain import pretrain
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.loop.trainer import Trainer, TrainingCallbacks

    config = RunConfig.from_flags(parse_args(argv, world_size=int(os.environ["WORLD_SIZE"])))
    holder, grads, squares, params, rates = {}, {}, {}, {}, {}

    def on_model_built(model, chunks, optimizer):
        holder.update(model=model, optimizer=optimizer)

    load = Trainer.load

    def load_and_record(trainer):  # the parameters the first step starts from
        iteration = load(trainer)
        params[0] = full_state(trainer.model, grads=False)
        return iteration

    Trainer.load = load_and_record

    def on_step(iteration, model, loss):
        if iteration in grad_steps:
            grads[iteration] = full_state(model, grads=True)
            squares[iteration] = norm_squares(model)
            params[iteration] = full_state(model, grads=False)
        rates[iteration] = module_learning_rates(
            holder["optimizer"], module_rates(config.training), config.training)

    summary = pretrain(config, TrainingCallbacks(on_model_built, on_step))
    summary.update(grads=grads, norm_squares=squares, rates=rates,
                   params_at=params, params=full_state(holder["model"], grads=False))
    return summary
