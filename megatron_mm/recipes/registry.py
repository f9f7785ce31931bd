"""The recipe registry: ``RECIPES`` {name: function}, each function returning a complete
``RunConfig`` (``model_config`` None until ``validated``), and the world size each is sized
for (``WORLD_SIZES``)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional

from ..config import ConfigError
from ..families import FAMILIES
from ..training.config.groups import GROUP_CLASSES
from ..training.config.run_config import RunConfig

RECIPES: Dict[str, Callable[[], RunConfig]] = {}
# The ranks a recipe is sized for (its TP x PP x CP x DP); the demos: 2 (any fits).
WORLD_SIZES: Dict[str, int] = {}
# The tokenizer's vocabulary (the run reads it from the tokenizer; the planner needs it).
VOCAB_SIZES: Dict[str, Optional[int]] = {}


def recipe(name: str, world_size: int, vocab_size: Optional[int] = None):
    """Registers the decorated function as the recipe ``name`` for ``world_size`` ranks."""
    def register(fn: Callable[[], RunConfig]) -> Callable[[], RunConfig]:
        RECIPES[name] = fn
        WORLD_SIZES[name] = world_size
        VOCAB_SIZES[name] = vocab_size
        return fn
    return register


def get_recipe(name: str) -> RunConfig:
    """The recipe ``name``'s RunConfig; a ConfigError names the known ones."""
    if name not in RECIPES:
        raise ConfigError(f"--recipe {name}: no such recipe; known: {', '.join(RECIPES)}")
    return RECIPES[name]()


def defaults() -> RunConfig:
    """Every group at its flags' defaults: what the command line gives with no flag."""
    return RunConfig(**{group: cls() for group, cls in GROUP_CLASSES.items()})


def with_fields(config: RunConfig, group: str, **changes) -> RunConfig:
    """``config`` with the fields ``changes`` of its group ``group`` replaced
    (``dataclasses.replace`` on the group, then on the config)."""
    return dataclasses.replace(
        config, **{group: dataclasses.replace(getattr(config, group), **changes)})


def with_family(config: RunConfig, family: str, **changes) -> RunConfig:
    """``config`` with the encoder family ``family``'s own flags (its ``EncoderFamily.flags``:
    ``qwen2_5_vl``'s ``Qwen2_5VLFlags`` ...) changed."""
    families = config.model.families.replace(FAMILIES[family].flags, **changes)
    return with_fields(config, "model", families=families)
