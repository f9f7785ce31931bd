"""Megatron-style training: arguments, initialisation, the loop, checkpoints, evaluation."""

from megatron_mm import te_import
from megatron_mm.patches import apply_cpu_patches
from megatron_mm.quiet import silence_expected_warnings

te_import.check_importable()  # before Megatron-Core imports TE (te_import.py)
silence_expected_warnings()
apply_cpu_patches()  # before any megatron.core import (each where its bug bites)
