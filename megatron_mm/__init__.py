"""megatron_mm: fast multimodal LLM training on Megatron-Core.

Importing this package does not import torch (the planning layer stays pure Python);
the torch-facing subpackages apply the CPU patches of megatron-core on import.
"""

__version__ = "0.1.0"
