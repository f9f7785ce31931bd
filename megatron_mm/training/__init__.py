"""Megatron-style training: arguments, initialisation, the loop, checkpoints, evaluation."""

from megatron_mm.patches import apply_cpu_patches

apply_cpu_patches()  # before any megatron.core import (no-op with CUDA)
