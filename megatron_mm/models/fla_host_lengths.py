"""Hand flash-linear-attention (FLA) the packed samples' lengths on the host.

FLA's varlen kernels derive their launch grids (chunk indices, sequence ids) from
``cu_seqlens``; given only the device tensor they read it back, a host sync per GDN layer
per micro-batch, in forward and in backward. Since FLA's PR 775 (``[Misc] Add
cu_seqlens_cpu parameter``) ``chunk_gated_delta_rule`` and ``causal_conv1d`` also take
``cu_seqlens_cpu`` and derive them from it. Megatron-Core 0.19.2's ``GatedDeltaNet``
passes only ``cu_seqlens``; the packed carrier (``models/packed_sequences.py``) holds the
host copy it was made from. ``HostLengthsGDN`` (the GDN specs' module: the hybrid LLM's
``SampleIsolatedGDN``) runs its forward inside ``host_lengths(carrier.cu_seqlens_cpu)``,
and its two kernels (``with_host_lengths``) add the keyword where the installed FLA
declares it (an older FLA, the deterministic torch rule and the CPU stand-ins are called
as before). Under context parallelism the kernels see other lengths than the carrier's:
no host copy is passed there.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from typing import Callable, Optional

import torch

from .linear_attention import SampleIsolatedGDN
from .packed_sequences import PackedSequences

_HOST = contextvars.ContextVar("megatron_mm_cu_seqlens_cpu", default=None)
KEYWORD = "cu_seqlens_cpu"


@contextlib.contextmanager
def host_lengths(cu_seqlens_cpu: Optional[torch.Tensor]):
    """The kernels called inside get ``cu_seqlens_cpu`` with their ``cu_seqlens``."""
    token = _HOST.set(cu_seqlens_cpu)
    try:
        yield
    finally:
        _HOST.reset(token)


def takes_host_lengths(kernel: Callable) -> bool:
    """Whether ``kernel`` declares ``cu_seqlens_cpu`` (FLA after its PR 775)."""
    try:
        return KEYWORD in inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return False


def with_host_lengths(kernel: Callable) -> Callable:
    """``kernel`` adding ``cu_seqlens_cpu`` (inside ``host_lengths``) where it takes it."""
    if kernel is None or getattr(kernel, "with_host_lengths", False) \
            or not takes_host_lengths(kernel):
        return kernel

    @functools.wraps(kernel)
    def call(*args, **kwargs):
        host = _HOST.get()
        if host is not None and kwargs.get("cu_seqlens") is not None:
            kwargs.setdefault(KEYWORD, host)
        return kernel(*args, **kwargs)

    call.with_host_lengths = True
    return call


def install_conv() -> None:
    """Megatron-Core's GDN calls ``causal_conv1d`` by its module global: wrap it there."""
    from megatron.core.ssm.gated_delta_net import gdn

    gdn.causal_conv1d = with_host_lengths(gdn.causal_conv1d)


class HostLengthsGDN(SampleIsolatedGDN):
    """``SampleIsolatedGDN`` whose FLA kernels get the packed row's host lengths."""

    def _setup_variant_attrs(self):
        super()._setup_variant_attrs()
        self.gated_delta_rule = with_host_lengths(self.gated_delta_rule)
        install_conv()

    def forward(self, hidden_states, attention_mask, inference_context=None,
                packed_seq_params=None, sequence_len_offset=None, **kwargs):
        host = (packed_seq_params.cu_seqlens_cpu
                if isinstance(packed_seq_params, PackedSequences) and self.cp_size == 1
                else None)
        with host_lengths(host):
            return super().forward(hidden_states, attention_mask, inference_context,
                                   packed_seq_params, sequence_len_offset, **kwargs)
