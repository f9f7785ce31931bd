"""megatron_mm: fast multimodal LLM training on Megatron-Core.

Importing this package does not import torch (the planning layer stays pure Python);
an entry point calls ``megatron_mm.startup.prepare_megatron_core()`` before the
subpackages that import Megatron-Core (``models``, ``training``, ``runtime``).
"""

import os

__version__ = "0.1.0"

# torch.cuda.is_available() then asks NVML instead of initialising the CUDA driver, which
# would make CUDA unusable in every process forked afterwards (a fork server's ranks,
# DataLoader workers): Megatron-Core asks it at import (dist_checkpointing). A user's own
# setting stands.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
