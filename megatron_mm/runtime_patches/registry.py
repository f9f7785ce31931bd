"""The patch registry: a table of named patches, applied once per process."""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

CHECKED_MEGATRON_CORE = "0.19.2"

# When a patch is needed: the condition its upstream bug needs, read from what is installed
# (never by importing megatron.core: patches go in before it is imported).
NO_CUDA = "no CUDA"  # upstream hard-codes CUDA (device="cuda", torch.cuda calls)
NO_TE = "no Transformer Engine"  # upstream's fallback without TE is broken
NO_APEX_OR_TE = "torch optimizers (no Apex, no Transformer Engine)"
ALWAYS = "always"  # the bug does not depend on the machine (or the patch checks itself)
PY311 = "Python below 3.12"  # megatron-core 0.19 declares 3.12; the wheel runs on 3.11
CONDITIONS = (NO_CUDA, NO_TE, NO_APEX_OR_TE, ALWAYS, PY311)


@dataclass(frozen=True)
class Patch:
    name: str
    replaces: str  # the upstream symbol(s) replaced, for readers and for the tests
    module: str  # the file in this folder that implements it
    needed_when: str = NO_CUDA  # one of CONDITIONS

    def __post_init__(self):
        assert self.needed_when in CONDITIONS, self.needed_when

    def apply(self) -> None:
        importlib.import_module(f"{__package__}.{self.module}").apply()

PATCHES: tuple[Patch, ...] = (
    Patch("triton_stub", "megatron.core.transformer.moe.ops.paged_stash (module)", "triton_stub",
          needed_when=ALWAYS),
    Patch("rng", "megatron.core.tensor_parallel.random._get_cuda_rng_state/_set_cuda_rng_state,"
          " CudaRNGStatesTracker.add/fork", "rng"),
    Patch("causal_mask", "megatron.core.transformer.utils.get_default_causal_mask,"
          " get_sliding_window_causal_mask", "causal_mask"),
    Patch("cuda_literals", "module-global `torch` of the schedules, optimizer and rope_utils"
          " modules (device='cuda' / pin_memory=True factories)", "cuda_literals"),
    Patch("distopt_load", "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer."
          "_set_main_param_and_optimizer_states, load_state_dict, state_dict", "distopt_load",
          needed_when=NO_APEX_OR_TE),
    Patch("tensor_cuda_noop", "torch.Tensor.cuda", "tensor_cuda_noop"),
    Patch("synchronize_noop", "torch.cuda.synchronize", "synchronize_noop"),
    Patch("clip_vit_norm", "megatron.core.models.vision.clip_vit_model.CLIPViTModel.__init__"
          " defaults ln_pre_impl/ln_post_impl", "clip_vit_norm", needed_when=NO_TE),
    Patch("current_stream", "torch.cuda.current_stream", "current_stream"),
    Patch("l2_norm", "megatron.core.utils.local_multi_tensor_l2_norm,"
          " megatron.core.optimizer.clip_grads.l2_norm_impl", "l2_norm"),
    Patch("tensor_type_str", "torch.Tensor.type (no-argument form)", "tensor_type_str"),
    Patch("current_device", "torch.cuda.current_device", "current_device"),
    Patch("moe_host_splits", "megatron.core.transformer.moe.token_dispatcher."
          "MoEAlltoAllTokenDispatcher.cuda_dtoh_stream, maybe_move_tensor_to_cpu",
          "moe_host_splits"),
    Patch("checkpoint_object_args", "megatron.core.tensor_parallel.random."
          "CheckpointFunction.forward", "checkpoint_object_args", needed_when=ALWAYS),
    Patch("destroy_resets_embedding_ranks",
          "megatron.core.parallel_state.destroy_model_parallel", "destroy_resets_embedding_ranks",
          needed_when=ALWAYS),
    Patch("gated_delta_net", "megatron.core.ssm.gated_delta_net.common.HAVE_FLA, causal_conv1d,"
          " l2norm, chunk_gated_delta_rule (and gdn.py's bindings), _GDNBase's jit_fuser"
          " methods", "gated_delta_net"),
    Patch("output_gate_eager", "megatron.core.transformer.attention.Attention._apply_output_gate"
          " (jit_fuser)", "output_gate_eager"),
    Patch("typing_override", "typing.override (Python 3.12), imported by"
          " megatron.training.models.gpt, megatron.training.models.hybrid", "typing_override",
          needed_when=PY311),
    Patch("training_cuda", "module-global `torch` of megatron.training.initialize,"
          " megatron.training.training, megatron.training.checkpointing,"
          " megatron.training.utils.common_utils, megatron.core.rerun_state_machine;"
          " megatron.training.training.set_jit_fusion_options,"
          " megatron.training.utils.common_utils.get_device_arch_version,"
          " megatron.training.arguments.add_megatron_arguments (defaults)", "training_cuda"),
    Patch("prebuilt_helpers", "megatron.core.datasets.utils.compile_helpers (the wheel's"
          " helpers_cpp is prebuilt, its Makefile absent)", "prebuilt_helpers",
          needed_when=ALWAYS),
    Patch("help_percent", "megatron.training.argument_utils.ArgumentGroupFactory."
          "_build_argparse_kwargs_from_field (help text)", "help_percent", needed_when=ALWAYS),
    Patch("tp_partial_grads", "megatron.core.distributed.finalize_model_grads."
          "_allreduce_non_tensor_model_parallel_grads (and its _allreduce_layernorm_grads"
          " alias)", "tp_partial_grads", needed_when=ALWAYS),
    Patch("defer_wgrad_local_linears", "megatron.core.tensor_parallel.layers."
          "ColumnParallelLinear.forward", "defer_wgrad_local_linears", needed_when=ALWAYS),
)

_applied: list[str] = []

def applied_patches() -> list[str]:
    return list(_applied)

def _cuda_available() -> bool:
    """Asked through NVML (``device_count``): ``is_available()`` initialises the CUDA
    driver unless PYTORCH_NVML_BASED_CUDA_CHECK=1, and patches apply at import, in the
    fork server that starts the ranks, whose CUDA then fails."""
    import torch

    return torch.cuda.device_count() > 0

def is_needed(patch: Patch, cuda: bool, installed: Callable[[str], bool]) -> bool:
    """Whether ``patch``'s upstream bug bites on a machine with (or without) ``cuda`` and
    the packages ``installed`` says are there."""
    if patch.needed_when == NO_CUDA:
        return not cuda
    if patch.needed_when == NO_TE:
        return not installed("transformer_engine")
    if patch.needed_when == PY311:
        import sys

        return sys.version_info < (3, 12)
    if patch.needed_when == NO_APEX_OR_TE:
        return not (installed("transformer_engine") or installed("apex"))
    return True


def apply_cpu_patches(names: Optional[Sequence[str]] = None, force: bool = False) -> list[str]:
    """Apply the patches (all, or those named) once, each where the condition its upstream
    bug needs holds (``Patch.needed_when``): on a CUDA machine with Transformer Engine
    only those that are needed always.

    ``force`` applies them as if CUDA were absent (tests only).
    """
    by_name = {p.name: p for p in PATCHES}
    unknown = set(names or ()) - set(by_name)
    if unknown:
        raise ValueError(f"unknown patches {sorted(unknown)}; known: {sorted(by_name)}")
    cuda = _cuda_available() and not force
    _check_version()
    for patch in PATCHES:
        if names is not None and patch.name not in names:
            continue
        if patch.name in _applied or not is_needed(patch, cuda, module_available):
            continue
        patch.apply()
        _applied.append(patch.name)
    return applied_patches()

def _check_version() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("megatron-core")
    except PackageNotFoundError:
        return
    if found != CHECKED_MEGATRON_CORE:
        warnings.warn(
            f"megatron_mm's CPU patches were checked against megatron-core "
            f"{CHECKED_MEGATRON_CORE}, found {found}", stacklevel=3
        )

def module_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None
