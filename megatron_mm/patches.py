"""Deprecated name of ``megatron_mm.runtime_patches`` (renamed apart from the upstream patch
files in the repository's ``patches/``); kept so that scripts written against it run."""

import warnings

from .runtime_patches import *  # noqa: F401,F403
from .runtime_patches import __all__  # noqa: F401

warnings.warn("megatron_mm.patches is now megatron_mm.runtime_patches", DeprecationWarning,
              stacklevel=2)
