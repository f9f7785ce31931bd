"""Workers of the flag matrix (``tests/training/test_flag_matrix.py``): many runs of
Megatron-LM's own ``pretrain`` (``examples/megatron_lm/pretrain_vlm.py``) and of
``examples/pretrain_mllm.py``'s in one launch, each row's result or error kept (a row
refused by name is a result too), with what a row asks to watch:

- ``wgrad``: Apex's ``fused_weight_gradient_mlp_cuda`` stood in by its arithmetic (its
  ``wgrad_gemm_accum_fp32``: ``main_grad += grad_output^T input``), so that
  ``--defer-embedding-wgrad-compute`` (which Megatron-Core builds only with gradient
  accumulation fusion) runs on a CPU (Megatron-Core's local linears other than the output
  layer compute their own weight gradients: the ``defer_wgrad_local_linears`` patch);
- the output layers' deferral buffers after each iteration (``buffers``: their longest),
  and the aligned parameter gathers the schedule dispatched (``param_syncs``: DDP's
  ``start_param_sync`` calls without ``force_sync``, which only ``param_sync_func``
  makes).
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
import types


def _accumulate(total_input, grad_output, main_grad):
    main_grad.add_(grad_output.t().matmul(total_input).to(main_grad.dtype))


WGRAD = types.ModuleType("fused_weight_gradient_mlp_cuda")
WGRAD.wgrad_gemm_accum_fp32 = _accumulate
WGRAD.wgrad_gemm_accum_fp16 = _accumulate


@contextlib.contextmanager
def wgrad_stand_in():
    """Megatron-Core's linears see Apex's weight-gradient kernel (``_accumulate``)."""
    from megatron.core.tensor_parallel import layers

    saved = (sys.modules.get(WGRAD.__name__), layers._grad_accum_fusion_available,
             getattr(layers, WGRAD.__name__, None))
    sys.modules[WGRAD.__name__] = WGRAD
    layers._grad_accum_fusion_available = True
    layers.fused_weight_gradient_mlp_cuda = WGRAD
    try:
        yield
    finally:
        if saved[0] is None:
            sys.modules.pop(WGRAD.__name__, None)
        layers._grad_accum_fusion_available = saved[1]
        if saved[2] is None:
            del layers.fused_weight_gradient_mlp_cuda
        else:
            layers.fused_weight_gradient_mlp_cuda = saved[2]


@contextlib.contextmanager
def watched(seen: dict):
    """Record, in ``seen``, the deferral buffers' lengths per logged iteration and the
    aligned parameter gathers (module docstring)."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.training import training

    import megatron_mm.megatron_lm as mm

    built = []
    seen.update(buffers={}, param_syncs=0)
    real_provider, real_log = mm.model_provider_for, training.training_log
    real_sync = DistributedDataParallel.start_param_sync

    def model_provider_for(language_model_provider):
        provider = real_provider(language_model_provider)

        def build(*args, **kwargs):
            model = provider(*args, **kwargs)
            built.append(model)
            return model
        return build

    def training_log(loss_dict, total_loss_dict, learning_rate, iteration, *args, **kwargs):
        lengths = [len(b) for m in built for lm in m.modules()
                   for b in (getattr(lm, "embedding_activation_buffer", None),
                             getattr(lm, "grad_output_buffer", None)) if b is not None]
        seen["buffers"][iteration] = max(lengths, default=None)
        return real_log(loss_dict, total_loss_dict, learning_rate, iteration, *args, **kwargs)

    def start_param_sync(self, *unused, force_sync=False, force_dispatch=False):
        if not force_sync:
            seen["param_syncs"] += 1
        return real_sync(self, *unused, force_sync=force_sync, force_dispatch=force_dispatch)

    mm.model_provider_for = model_provider_for
    training.training_log = training_log
    DistributedDataParallel.start_param_sync = start_param_sync
    try:
        yield
    finally:
        mm.model_provider_for, training.training_log = real_provider, real_log
        DistributedDataParallel.start_param_sync = real_sync


def run_rows(rank: int, rows: list) -> list:
    """Each ``(kind, argv, watch)`` in turn ("ours" or "megatron_lm"; ``watch``: a set of
    "wgrad"): its losses, grad norms and what was watched, or its error (``error``: the
    exception's text, ``output``: the ranks' output tail)."""
    from script_runs import captured_output

    from megatron_lm_runs import run_megatron_lm, run_ours

    results = []
    for kind, argv, watch in rows:
        seen, start, error = {}, time.time(), None
        stand_in = wgrad_stand_in() if "wgrad" in watch else contextlib.nullcontext()
        with captured_output() as out:
            try:
                with stand_in, watched(seen):
                    seen.update((run_ours if kind == "ours" else run_megatron_lm)(argv))
            except BaseException as e:  # noqa: BLE001  (a refusal is a row's result)
                error = f"{type(e).__name__}: {e}"
                trace = traceback.format_exc()
                _reset_state()
        seen.update(error=error, seconds=time.time() - start,
                    output=(out["stdout"] + out["stderr"])[-4000:])
        if error is not None:
            seen["output"] += trace
        results.append(seen)
    return results


def _reset_state() -> None:
    """After a refused row: the process groups and Megatron-LM's globals gone, as a
    finished run leaves them."""
    from megatron.core import parallel_state

    with contextlib.suppress(Exception):
        from megatron.training import training
        training.destroy_global_state()
    with contextlib.suppress(Exception):
        parallel_state.destroy_model_parallel()
