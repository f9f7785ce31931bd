"""Patch ``typing_override``: ``typing.override`` on Python 3.11, so that Megatron-LM's
training package (``megatron.training.models.gpt``) imports."""

import sys
import typing

import pytest


@pytest.mark.slow  # imports Megatron-LM's training package
@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 has typing.override")
def test_override_marks_the_method_and_megatron_training_imports():
    @typing.override
    def method(self):
        return 1

    assert method.__override__ is True and method(None) == 1
    import megatron.training.models.gpt  # noqa: F401  (its `from typing import override`)
