"""Deprecated place of ``RunConfig`` and ``parse_run_config`` (now ``training.config.run_config``
and ``training.cli.arguments``); kept so that scripts written against it run."""

import warnings

from .cli.arguments import parse_run_config  # noqa: F401
from .config.run_config import RunConfig  # noqa: F401

warnings.warn("megatron_mm.training.run_config is now megatron_mm.training.config.run_config "
              "(RunConfig) and megatron_mm.training.cli.arguments (parse_run_config)",
              DeprecationWarning, stacklevel=2)
