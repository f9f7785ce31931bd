"""The flags made from the typed groups are the flags the hand-written parser had: every
option string with its dest, default, type, choices, nargs, constant and help
(``tests/fixtures/flags.json``, written from the parser before the groups existed). A flag
pair (``--x`` / ``--no-x``) is one field now, a ``BooleanOptionalAction``: each of its
option strings stores what its own action stored."""

import argparse
import json
import os

from megatron_mm.training.cli.arguments import build_parser

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "fixtures",
                       "flags.json")


def option_records(parser: argparse.ArgumentParser) -> dict:
    """{option string: what parsing it does} for every flag of ``parser``."""
    out = {}
    for action in parser._actions:
        if not action.option_strings or "-h" in action.option_strings:
            continue
        for option in action.option_strings:
            if isinstance(action, argparse.BooleanOptionalAction):
                const = not option.startswith("--no-")
            else:
                const = action.const
            default = action.default
            out[option] = {
                "dest": action.dest,
                "default": list(default) if isinstance(default, tuple) else default,
                "type": getattr(action.type, "__name__", "str") if action.type else "str",
                "choices": [str(c) for c in action.choices] if action.choices else None,
                "nargs": 0 if action.nargs == 0 or const in (True, False)
                and action.type is None and action.nargs is None else action.nargs,
                "const": const, "metavar": action.metavar,
                "help": action.help or ""}
    return out


def test_no_flag_changed_its_name_default_or_meaning():
    before = json.load(open(FIXTURE))
    after = option_records(build_parser())
    assert sorted(after) == sorted(before), "flags added or removed"
    for option, record in before.items():
        now = after[option]
        if now["const"] is False and record["help"] != now["help"]:
            now = {**now, "help": record["help"]}  # a pair's --no-* shares its field's help
        assert now == record, f"{option}: {record} -> {now}"


def test_a_pair_parses_as_its_two_flags_did():
    parser = build_parser()
    args = parser.parse_args([])
    assert args.check_for_nan_in_loss_and_grad is True
    assert args.yarn_correction_range_round_to_int is None
    args = parser.parse_args(["--no-check-for-nan-in-loss-and-grad",
                              "--no-yarn-correction-range-round-to-int"])
    assert args.check_for_nan_in_loss_and_grad is False
    assert args.yarn_correction_range_round_to_int is False
    args = parser.parse_args(["--yarn-correction-range-round-to-int"])
    assert args.yarn_correction_range_round_to_int is True
