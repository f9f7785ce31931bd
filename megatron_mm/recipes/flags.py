"""A recipe as a command line: the flags whose values differ from the parser's defaults
(``tools/plan.py --recipe`` reads them; ``python -m megatron_mm.recipes NAME`` prints them)."""

from __future__ import annotations

import argparse
import shlex
from typing import List

from .registry import get_recipe


def recipe_argv(name: str) -> List[str]:
    """The flags that give the recipe ``name`` on an empty command line (its values that
    differ from the defaults)."""
    from ..training.cli.arguments import build_parser

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


def recipe_command_line(name: str) -> str:
    return shlex.join(recipe_argv(name))
