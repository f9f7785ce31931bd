"""Give Python 3.11 ``typing.override`` (a 3.12 name; ``typing_extensions``' own).

megatron-core 0.19.2 declares Python >= 3.12; only ``megatron.training.models.gpt`` and
``megatron.training.models.hybrid`` use a 3.12 name, ``from typing import override``, and ``import
megatron.training`` imports them (``ImportError: cannot import name 'override'``).
``override`` only marks a method (it sets ``__override__``), as typing_extensions' does.
"""

import typing


def _override(method):
    try:
        method.__override__ = True
    except (AttributeError, TypeError):
        pass
    return method


def apply() -> None:
    if not hasattr(typing, "override"):
        typing.override = _override
