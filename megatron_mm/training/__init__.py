"""Megatron-style training: arguments, initialisation, the loop, checkpoints, evaluation."""

from megatron_mm.startup import require_prepared

require_prepared(__name__)  # the CPU patches go in before any megatron.core import
