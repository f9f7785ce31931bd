"""``--transformer-impl transformer_engine`` without Transformer Engine: an error up front.

Checked with the other flags, before any process group exists; no torch import, and TE is
only looked up, never imported here. Whether TE imports and a CUDA device exists is
checked when the run's impl is resolved (``training/build_settings.py`` ``transformer_impl``,
``models/specs.py``), and before Megatron-Core is imported (``te_import.py``).
"""

from __future__ import annotations

from typing import Optional

from ...config import ConfigError
from ...te_import import INSTALL, transformer_engine_installed


def validate_transformer_impl(config, te_installed: Optional[bool] = None) -> None:
    if te_installed is None:
        te_installed = transformer_engine_installed()
    if config.model.transformer_impl == "transformer_engine" and not te_installed:
        raise ConfigError(
            "--transformer-impl transformer_engine needs Transformer Engine, which is not "
            f"installed: {INSTALL}; or pass --transformer-impl local")
