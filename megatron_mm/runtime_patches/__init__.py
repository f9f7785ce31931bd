"""Runtime patches that let megatron-core run on a CPU-only torch with gloo.

Each patch names the upstream function it replaces and the megatron-core version it was
checked against. ``apply_cpu_patches()`` applies each only where the condition its
upstream bug needs holds (most: no CUDA; some: no Transformer Engine or Apex), so a CUDA
machine with Transformer Engine depends on none of the CPU fixes. Apply before any other
``megatron.core`` import: some patched functions are bound by name at import time elsewhere.
"""

from .registry import PATCHES, CHECKED_MEGATRON_CORE, apply_cpu_patches, applied_patches

__all__ = ["PATCHES", "CHECKED_MEGATRON_CORE", "apply_cpu_patches", "applied_patches"]
