"""``--transformer-impl transformer_engine`` without Transformer Engine: an error up front.

Checked with the other flags, before any process group exists; no torch import, and TE is
only looked up, never imported (a broken TE install raises on import, and breaks
``import megatron.core``). Whether TE imports and a CUDA device exists is checked where
the layer specs are chosen (``models/specs.py``).
"""

from __future__ import annotations

import importlib.util
from typing import Optional

from ..config import ConfigError


def validate_transformer_impl(args, te_installed: Optional[bool] = None) -> None:
    if te_installed is None:
        te_installed = importlib.util.find_spec("transformer_engine") is not None
    if args.transformer_impl == "transformer_engine" and not te_installed:
        raise ConfigError(
            "--transformer-impl transformer_engine needs Transformer Engine, which is not "
            "installed: install transformer-engine[pytorch] on a GPU machine, or pass "
            "--transformer-impl local")
