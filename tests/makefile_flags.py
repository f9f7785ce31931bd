"""A Makefile variable's flags as make gives them (continued lines joined, ``$(VAR)``
references to the Makefile's other variables expanded), for tests that run a demo's own
flags without starting make. The demos' variables name a recipe (``--recipe demo_qwen``):
by default it is written out as the flags it sets (``cli/recipe_flags.recipe_argv``), so a
test can replace one of them."""

import re
import shlex
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def makefile_flags(name: str, expand_recipe: bool = True) -> list:
    text = MAKEFILE.read_text().replace("\\\n", " ")
    values = dict(re.findall(r"^([A-Z_0-9]+)\s*=(.*)$", text, flags=re.M))

    def expand(value: str) -> str:
        return re.sub(r"\$\(([A-Z_0-9]+)\)", lambda m: expand(values[m.group(1)]), value)

    flags = shlex.split(expand(values[name]))
    if expand_recipe and "--recipe" in flags:
        from megatron_mm.training.cli.recipe_flags import recipe_argv, split_recipe

        recipe, rest = split_recipe(flags)
        flags = recipe_argv(recipe) + rest
    return flags
