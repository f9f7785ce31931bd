"""CPU stand-ins for flash-linear-attention (FLA) in Megatron-Core's Gated DeltaNet.

Replaces, in megatron-core 0.19.2, ``megatron.core.ssm.gated_delta_net``'s
``common.HAVE_FLA``, ``common.causal_conv1d``, ``common.l2norm`` and
``common.chunk_gated_delta_rule`` (and the two ``gdn.py`` binds by name at import), and
runs ``_GDNBase``'s three ``jit_fuser`` methods eagerly. Upstream's
``GatedDeltaNet.__init__`` raises without FLA, and FLA's kernels are Triton (CUDA only);
its own torch rule (``torch_chunk_gated_delta_rule``, the ``deterministic_mode`` path)
takes no ``cu_seqlens``, so packed samples would carry one sample's recurrent and
convolution state into the next.

The stand-ins take FLA's arguments and ``cu_seqlens``: each packed sample runs on its own
(upstream's torch rule per sample, a zero state at each start, in chunks of 16 tokens for
short samples: ``rule_chunk``; the causal convolution padded per sample). Applied only
without CUDA: on a GPU without FLA upstream's
ImportError stands (and ``models/linear_attention.py`` names the package up front).
The eager methods: ``jit_fuser`` is ``torch.compile``, whose CPU (inductor C++) compile
costs seconds per new shape and changes nothing a CPU run checks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

UPSTREAM = {}  # what the patch found (the test checks upstream lacked FLA)
_JIT_METHODS = ("_prepare_input_for_gated_delta_rule", "_apply_gated_norm",
                "_compute_g_and_beta")


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6, **_) -> torch.Tensor:
    """FLA's ``l2norm`` (and transformers' Qwen3.5): x / sqrt(sum x^2 + eps), in fp32."""
    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).sum(dim, keepdim=True) + eps)).to(x.dtype)


def _segments(total: int, cu_seqlens):
    if cu_seqlens is None:
        return [(0, total)]
    cu = cu_seqlens.tolist()  # a CPU tensor here: no device read
    if cu[0] != 0 or cu[-1] != total:
        raise ValueError(f"cu_seqlens {cu} do not cover the {total} packed tokens")
    return list(zip(cu[:-1], cu[1:]))


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias=None, activation=None,
                  initial_state=None, output_final_state: bool = False, cu_seqlens=None,
                  **_):
    """FLA's ``causal_conv1d``: x [B, T, D], a depthwise weight [D, W]; each sample of
    ``cu_seqlens`` (B = 1) padded on its own left, so no token sees another sample's."""
    if initial_state is not None or output_final_state:
        raise NotImplementedError("the CPU causal_conv1d keeps no convolution state")
    if cu_seqlens is not None and x.shape[0] != 1:
        raise ValueError("packed samples (cu_seqlens) run as one row (batch 1)")
    width = weight.shape[-1]
    outs = []
    for start, end in _segments(x.shape[1], cu_seqlens):
        seg = x[:, start:end].transpose(1, 2)  # [B, D, t]
        y = F.conv1d(seg, weight.unsqueeze(1), bias, padding=width - 1,
                     groups=weight.shape[0])[..., :end - start]
        outs.append(y.transpose(1, 2))
    y = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
    if activation in ("silu", "swish"):
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"causal_conv1d activation {activation!r}: silu or None")
    return y, None


# The torch rule's chunk: FLA's (and upstream's default) 64, but 16 for a sample of at most
# SHORT tokens. The chunked form is exact at any chunk (only rounding differs); on CPU its
# cost is op launches, C per chunk for the in-chunk solve (a Python loop whose autograd
# copies the whole C x C matrix per step) plus one per chunk: at 80 tokens, chunks of 16
# run a step's forward and backward about 10x faster than chunks of 64 (the demo's).
SHORT = 256


def rule_chunk(tokens: int) -> int:
    return 16 if tokens <= SHORT else 64


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state: bool = False,
                           use_qk_l2norm_in_kernel: bool = False, cu_seqlens=None, **_):
    """FLA's ``chunk_gated_delta_rule`` (q / k [B, T, H, K], v [B, T, H, V]) by
    upstream's torch rule, once per sample of ``cu_seqlens`` (each from a zero state)."""
    from megatron.core.ssm.gated_delta_net.common import torch_chunk_gated_delta_rule

    if scale is not None and scale != q.shape[-1] ** -0.5:
        raise NotImplementedError("the torch gated delta rule scales by 1/sqrt(head dim)")
    if initial_state is not None or output_final_state:
        raise NotImplementedError("the CPU gated delta rule keeps no recurrent state")
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError("packed samples (cu_seqlens) run as one row (batch 1)")
    outs = [torch_chunk_gated_delta_rule(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e],
                                         beta[:, s:e], chunk_size=rule_chunk(e - s))[0]
            for s, e in _segments(q.shape[1], cu_seqlens)]
    return (torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]), None


def apply() -> None:
    from megatron.core.ssm.gated_delta_net import common, gdn

    UPSTREAM.update(HAVE_FLA=common.HAVE_FLA, causal_conv1d=common.causal_conv1d,
                    chunk_gated_delta_rule=common.chunk_gated_delta_rule)
    if common.HAVE_FLA:  # FLA installed (its CPU path would still need Triton): leave it
        return
    common.HAVE_FLA = True
    common.l2norm = l2norm
    common.causal_conv1d = gdn.causal_conv1d = causal_conv1d
    common.chunk_gated_delta_rule = gdn.chunk_gated_delta_rule = chunk_gated_delta_rule
    for name in _JIT_METHODS:
        method = getattr(common._GDNBase, name)
        setattr(common._GDNBase, name, getattr(method, "_torchdynamo_orig_callable", method))
