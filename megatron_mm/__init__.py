"""megatron_mm: fast multimodal LLM training on Megatron-Core.

Importing this package does not import torch (the planning layer stays pure Python);
the torch-facing subpackages apply the CPU patches of megatron-core on import.
"""

import os

__version__ = "0.1.0"

# torch.cuda.is_available() then asks NVML instead of initialising the CUDA driver, which
# would make CUDA unusable in every process forked afterwards (a fork server's ranks,
# DataLoader workers): Megatron-Core asks it at import (dist_checkpointing). A user's own
# setting stands.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
