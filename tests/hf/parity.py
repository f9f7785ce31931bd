"""Load a converted checkpoint the way the training script does (``--load`` alone
decides the architecture) at some TP / PP, and run it to full-vocabulary logits: the
functions ``convert_hf.py compare`` runs (``megatron_mm/hf/compare.py``)."""

from megatron_mm.hf.compare import load_converted, logits

__all__ = ["load_converted", "logits"]
