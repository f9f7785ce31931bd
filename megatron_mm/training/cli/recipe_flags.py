"""``--recipe NAME`` then flags on top (Megatron-Bridge's overrides): the recipe's values
become the parser's defaults, so the flags given win. A recipe's values are defaults, not
flags given: with ``--load``, the checkpoint's architecture replaces them, as it replaces
any flag left out (``arguments.apply_checkpoint_args``); only flags written on the command
line must agree with it."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence, Tuple

from ...config import ConfigError

RECIPE_FLAG = "--recipe"


def split_recipe(argv: Optional[Sequence[str]]) -> Tuple[Optional[str], List[str]]:
    """The recipe ``argv`` names (``--recipe NAME`` or ``--recipe=NAME``) and the other
    flags (``argv`` None: the command line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name, rest, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == RECIPE_FLAG:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ConfigError(f"{RECIPE_FLAG} needs a recipe's name")
            name, i = argv[i + 1], i + 2
            continue
        if arg.startswith(RECIPE_FLAG + "="):
            name = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return name, rest


def recipe_defaults(parser: argparse.ArgumentParser, name: str) -> None:
    """Makes the recipe ``name``'s values the defaults of ``parser``'s flags (a ConfigError
    names the known recipes)."""
    from ...recipes import get_recipe

    values = get_recipe(name).flags()
    dests = {action.dest for action in parser._actions}
    parser.set_defaults(**{dest: value for dest, value in values.items() if dest in dests})
