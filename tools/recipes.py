"""``python tools/recipes.py [NAME ...]``: each recipe as the flags it sets (those
not at their default), one command line per recipe; no name: the recipes and their world
sizes."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_mm.startup import prepare_megatron_core


def main(argv=None) -> int:
    prepare_megatron_core()  # the recipes import megatron_mm.training
    from megatron_mm.recipes import RECIPES, WORLD_SIZES
    from megatron_mm.training.cli.recipe_flags import recipe_argv

    names = list(sys.argv[1:] if argv is None else argv)
    if not names:
        for name, fn in RECIPES.items():
            print(f"{name:22s} {WORLD_SIZES[name]:3d} ranks  {fn.__doc__.splitlines()[0]}")
        return 0
    for name in names:
        print(" ".join(recipe_argv(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
