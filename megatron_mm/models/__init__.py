"""Model code: single-device modules built from Megatron-Core parts; parallelism comes from
Megatron-Core's tensor-parallel layers and the process groups set up outside."""

from megatron_mm.startup import require_prepared

require_prepared(__name__)  # the CPU patches go in before the megatron.core imports below

from .build import BuildSettings, build_model, model_chain  # noqa: E402
from .multimodal import MultimodalModel  # noqa: E402

__all__ = ["BuildSettings", "MultimodalModel", "build_model", "model_chain"]
