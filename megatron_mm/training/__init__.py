"""Megatron-style training: arguments, initialisation, the loop, checkpoints, evaluation."""

from megatron_mm.patches import apply_cpu_patches
from megatron_mm.quiet import silence_expected_warnings

silence_expected_warnings()
apply_cpu_patches()  # before any megatron.core import (each where its bug bites)
