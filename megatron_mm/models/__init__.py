"""Model code: single-device modules built from Megatron-Core parts; parallelism comes from
Megatron-Core's tensor-parallel layers and the process groups set up outside."""

from megatron_mm import te_import
from megatron_mm.patches import apply_cpu_patches
from megatron_mm.quiet import silence_expected_warnings

te_import.check_importable()  # before Megatron-Core imports TE (te_import.py)
silence_expected_warnings()
apply_cpu_patches()  # before any megatron.core import below (each where its bug bites)

from .build import BuildSettings, build_model, model_chain  # noqa: E402
from .multimodal import MultimodalModel  # noqa: E402

__all__ = ["BuildSettings", "MultimodalModel", "build_model", "model_chain"]
