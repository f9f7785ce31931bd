"""Recipes: Python functions that return a complete typed ``RunConfig`` (docs/recipes.md).
``RECIPES`` names them; ``--recipe NAME`` on the command line takes one's values as the
flags' defaults. Importing this package imports ``megatron_mm.training``: call
``megatron_mm.startup.prepare_megatron_core()`` first."""

from .demos import demo, demo_audio, demo_qwen, demo_qwen3, demo_qwen35
from .models import (internvl3_8b, llava_7b_stage2, qwen2_5_vl_7b_sft, qwen3_5_9b_lora,
                     qwen3_vl_8b_sft, qwen3_vl_30b_a3b_ep)
from .registry import (RECIPES, VOCAB_SIZES, WORLD_SIZES, defaults, get_recipe, with_family,
                       with_fields)

__all__ = ["RECIPES", "VOCAB_SIZES", "WORLD_SIZES", "defaults", "demo", "demo_audio",
           "demo_qwen", "demo_qwen3", "demo_qwen35", "get_recipe", "internvl3_8b",
           "llava_7b_stage2", "qwen2_5_vl_7b_sft", "qwen3_5_9b_lora", "qwen3_vl_30b_a3b_ep",
           "qwen3_vl_8b_sft", "with_family", "with_fields"]
