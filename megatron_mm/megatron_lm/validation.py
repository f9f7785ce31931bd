"""The package's validation answer accuracy in Megatron-LM's loop: after Megatron-LM's
``evaluate_and_print_results`` (its ``lm loss`` box), greedy decoding of the validation
samples' answers (``--eval-max-new-tokens`` above 0) through the run's schedule, as
``examples/pretrain_mllm.py`` reports it: one more box in the log and ``val answer
accuracy`` on TensorBoard. ``use_encoder_schedule`` installs it."""

from __future__ import annotations

from ..training.loop.evaluation import answer_accuracy
from .context import run_context


def report_answer_accuracy(prefix: str, model, iteration: int, forward_backward=None,
                           write_to_tensorboard: bool = True) -> None:
    """``forward_backward``: the encoder schedule's executor, or None (Megatron-Core's)."""
    run = run_context()
    validation = run.config.validation
    if validation.eval_max_new_tokens <= 0:  # 0: no greedy decoding
        return
    from megatron.training import get_args, get_tensorboard_writer
    from megatron.training.utils import print_rank_last

    valid = run.valid_dataset()
    n = min(len(valid), validation.eval_iters * run.config.training.global_batch_size)
    model = model if isinstance(model, list) else [model]
    accuracy = answer_accuracy(run.config, model, valid, run.tokenizer, range(n),
                               forward_backward, run.attention)
    line = (f" validation answer accuracy at {prefix} | val answer accuracy: "
            f"{accuracy:.4f} ({n} samples) |")
    print_rank_last("-" * len(line) + "\n" + line + "\n" + "-" * len(line))
    writer = get_tensorboard_writer() if write_to_tensorboard else None
    if writer is not None:
        writer.add_scalar("val answer accuracy", accuracy, iteration)
        writer.add_scalar("val answer accuracy vs samples", accuracy,
                          get_args().consumed_train_samples)
