"""Runs of Megatron-LM's own ``megatron.training.pretrain`` (the wheel's) through
``examples/megatron_lm/pretrain_vlm.py`` (the package's provider, forward step and data
around the user's GPT) beside ``examples/pretrain_mllm.py``'s pretrain, in the same ranks
one after the other: ``run_steps(rank, steps)`` with steps ``("ours", argv)`` or
``("megatron_lm", argv)``; each gives its losses and gradient norms by iteration.

``ours_flags`` / ``megatron_lm_flags`` are one tiny model's flags for each script: the
same architecture, optimizer and data, with what Megatron-LM needs said explicitly (its
defaults differ: dropout, norm epsilon, fusions, the per-token loss, the data loader)."""

from __future__ import annotations

import importlib.util
import os
import sys

TINY = [
    "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--seq-length", "64", "--max-position-embeddings", "64", "--norm-epsilon", "1e-6",
    "--vision-hidden-size", "32", "--vision-num-layers", "2",
    "--vision-num-attention-heads", "2", "--img-h", "16", "--img-w", "16", "--patch-dim", "4",
    "--disable-vision-class-token", "--projector-ffn-hidden-size", "64",
    "--lr", "1e-3", "--lr-decay-style", "constant", "--weight-decay", "0.0",
    "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.999", "--adam-eps", "1e-8",
    "--micro-batch-size", "2", "--global-batch-size", "4", "--seed", "1234",
    "--log-interval", "1", "--eval-iters", "0", "--untie-embeddings-and-output-weights",
]
# A Llama-shaped LLM as examples/pretrain_mllm.py builds it, in Megatron-LM's flags
LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
         "--position-embedding-type", "rope"]
MEGATRON_LM = [
    "--dataloader-type", "external", "--calculate-per-token-loss", "--eval-interval", "1000",
    "--distributed-backend", "gloo", "--transformer-impl", "local",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--use-cpu-initialization",
    "--no-persist-layer-norm", "--no-gradient-accumulation-fusion", "--no-bias-dropout-fusion",
    "--no-bias-swiglu-fusion", "--no-bias-gelu-fusion", "--no-masked-softmax-fusion",
    "--no-rope-fusion", "--tokenizer-type", "SentencePieceTokenizer", "--num-workers", "0",
]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "megatron_lm", "pretrain_vlm.py")
# a user's own script (Megatron-LM's pretrain_vlm.py shape): its GPT Megatron-LM's defaults
USER_SCRIPT = os.path.join(ROOT, "tests", "megatron_lm", "user_pretrain_vlm.py")
# What a Megatron-LM run of the tiny model says beside the model: no CPU flag (the CPU
# defaults of prepare_megatron_core), dropout 0 (runs of other layouts compare)
USER = ["--dataloader-type", "external", "--eval-interval", "1000",
        "--transformer-impl", "local", "--hidden-dropout", "0", "--attention-dropout", "0",
        "--tokenizer-type", "SentencePieceTokenizer", "--num-workers", "0"]


def ours_flags(*extra: str) -> list:
    return TINY + list(extra)


def megatron_lm_flags(*extra: str, llm=LLAMA, model=TINY) -> list:
    """``model``'s flags (default the tiny model's) for the example script, the LLM's shape
    as ``llm`` says, Megatron-LM's settings and the package's default tokenizer file (a
    later ``--tokenizer-type`` / ``--tokenizer-model`` in ``extra`` wins)."""
    from megatron_mm.data.tokenizer import default_tokenizer_model

    return list(model) + list(llm) + MEGATRON_LM + [
        "--tokenizer-model", default_tokenizer_model()] + list(extra)


def user_flags(*extra: str) -> list:
    """The tiny model's flags for the user's script (``USER_SCRIPT``)."""
    from megatron_mm.data.tokenizer import default_tokenizer_model

    return TINY + USER + ["--tokenizer-model", default_tokenizer_model()] + list(extra)


def _script(path: str = SCRIPT):
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f"megatron_lm_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_megatron_lm(argv: list, script: str = SCRIPT, **main_kwargs) -> dict:
    """``script``'s ``main(**main_kwargs)`` (default the example's) on ``argv``: losses and
    grad norms by iteration, as Megatron-LM's ``training_log`` reports them (last pipeline
    stage: the loss)."""
    from megatron.training import training

    seen = {"losses": {}, "grad_norms": {}}
    real = training.training_log

    def training_log(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale,
                     report_memory_flag, skipped_iter, grad_norm, *args, **kwargs):
        loss = loss_dict.get("lm loss")
        if loss is not None:
            seen["losses"][iteration] = float(loss)
        seen["grad_norms"][iteration] = float(grad_norm or 0.0)
        return real(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale,
                    report_memory_flag, skipped_iter, grad_norm, *args, **kwargs)

    training.training_log = training_log
    saved_argv = sys.argv
    sys.argv = [script] + list(argv)
    try:
        _script(script).main(**main_kwargs)
    except SystemExit as e:  # --exit-interval: Megatron-LM's train() exits the process
        if e.code not in (0, None):
            raise
    finally:
        sys.argv = saved_argv
        training.training_log = real
        training.destroy_global_state()  # Megatron-LM's globals: another run may follow
    return seen


def run_ours(argv: list) -> dict:
    """examples/pretrain_mllm.py's pretrain on ``argv``: losses and grad norms."""
    from megatron.core import parallel_state

    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.pretrain import pretrain
    from megatron_mm.training.config.run_config import RunConfig

    try:
        summary = pretrain(RunConfig.from_flags(parse_args(argv)))
    finally:
        parallel_state.destroy_model_parallel()
    return {"losses": dict(summary["losses"]), "grad_norms": dict(summary["grad_norms"])}


def run_user_script(argv: list, **main_kwargs) -> dict:
    return run_megatron_lm(argv, USER_SCRIPT, **main_kwargs)


def user_script_exits(argv: list, **main_kwargs) -> dict:
    """The user's script expected to stop: its exit status (``run_steps`` adds stderr)."""
    try:
        run_user_script(argv, **main_kwargs)
    except SystemExit as e:  # (Megatron-LM's state destroyed: run_megatron_lm)
        return {"returncode": e.code}
    return {"returncode": 0}


RUNS = {"ours": run_ours, "megatron_lm": run_megatron_lm, "user": run_user_script,
        "user_exits": user_script_exits}


def run_steps(rank: int, steps: list) -> list:
    """Each ``(kind, argv[, main's keywords])`` in turn (``RUNS``), its output captured:
    stderr and the log lines of the encoder schedule and validation kept."""
    from script_runs import captured_output

    import time

    results = []
    for kind, argv, *kwargs in steps:
        error, start = None, time.time()
        with captured_output() as out:
            try:
                results.append(RUNS[kind](argv, **(kwargs[0] if kwargs else {})))
            except BaseException as e:  # noqa: BLE001  (re-raised with the output)
                error = e
        if error is not None:
            tail = (out["stdout"] + out["stderr"])[-6000:]
            raise RuntimeError(f"{kind} {argv}: {error!r}\n{tail}") from error
        results[-1]["seconds"] = time.time() - start  # for the report, never asserted
        results[-1]["stderr"] = out["stderr"]
        results[-1]["log"] = [line for line in out["stdout"].splitlines()
                              if "encoder schedule" in line or "validation" in line]
    return results
