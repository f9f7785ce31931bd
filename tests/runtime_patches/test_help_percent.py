"""Patch ``help_percent``: ``--help`` of Megatron-LM's parser prints the help built from
the config dataclasses' docstrings, a literal ``%`` included (before: ``ValueError:
unsupported format character ')'``, from ``TransformerConfig.
moe_paged_stash_buffer_size_factor_cuda``'s "10%"). Both scripts' ``--help``:
tests/megatron_lm/test_help.py; the upstream fix: patches/0008."""

import argparse

import pytest

pytestmark = pytest.mark.slow  # imports Megatron-LM's training package


def test_megatron_lm_help_prints_a_percent_sign():
    from megatron.training.arguments import add_megatron_arguments

    help_text = add_megatron_arguments(argparse.ArgumentParser()).format_help()
    assert "(e.g. 1.10 = 10%)." in " ".join(help_text.split())
    assert "%%" not in help_text
