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


def recipe_argv(name: str) -> List[str]:
    """The flags that give the recipe ``name`` on an empty command line (its values that
    differ from the defaults)."""
    from ...recipes import get_recipe
    from .arguments import build_parser

    values = get_recipe(name).flags()
    out: List[str] = []
    for action in build_parser()._actions:
        if not action.option_strings or action.dest not in values:
            continue
        value = values[action.dest]
        if value == action.default or (isinstance(value, (list, tuple))
                                       and list(value) == list(action.default or [])
                                       and action.default is not None):
            continue
        option = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            out.append(option if value else "--no-" + option[2:])
        elif action.nargs == 0:  # store_true / store_false
            if value == action.const:
                out.append(option)
        elif isinstance(value, (list, tuple)):
            out += [option, *map(str, value)]
        else:
            out += [option, str(value)]
    return out

