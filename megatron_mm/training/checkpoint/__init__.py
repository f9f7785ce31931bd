"""Checkpoints: saving, loading, their integrity, LoRA adapters and the Hugging Face sidecar, and
their errors."""
