"""The patch table (``megatron_mm/runtime_patches/registry.py``): what ``apply_cpu_patches``
applies, and what each entry documents."""

import importlib
import re
from importlib.metadata import version

import pytest

from megatron_mm.runtime_patches import (CHECKED_MEGATRON_CORE, PATCHES, apply_cpu_patches,
                                         applied_patches)

ALL = [p.name for p in PATCHES]


def test_fourteen_patches_all_applied_here():
    assert len(ALL) == len(set(ALL)) == 23
    assert applied_patches() == ALL  # by conftest, in table order
    assert apply_cpu_patches() == ALL  # applying again changes nothing
    with pytest.raises(ValueError, match="unknown patches"):
        apply_cpu_patches(["no_such_patch"])


def test_on_cuda_only_the_patches_whose_bug_is_not_about_cuda(registry_under_cuda):
    """CUDA present, neither Transformer Engine nor Apex installed (this venv): the CUDA
    stand-ins stay out; the fixes for torch AdamW in the distributed optimizer, for
    CLIPViTModel's norm without TE, the triton stub and the parallel_state reset go in."""
    got = registry_under_cuda
    expected = ["triton_stub", "distopt_load", "clip_vit_norm", "checkpoint_object_args",
                "destroy_resets_embedding_ranks", "typing_override", "prebuilt_helpers",
                "help_percent", "tp_partial_grads", "defer_wgrad_local_linears"]
    assert got["returned"] == got["again"] == got["applied"] == expected
    assert got["stub_installed"]  # needed with CUDA too, when triton is missing
    assert all(got["torch_cuda_unchanged"].values()), got["torch_cuda_unchanged"]
    assert all(got["torch_tensor_unchanged"].values()), got["torch_tensor_unchanged"]
    # No other patch module was even imported, so none of their apply() ran.
    assert got["patch_modules_imported"] == sorted(
        ["megatron_mm.runtime_patches.registry", "megatron_mm.runtime_patches.after_import"]
        + [f"megatron_mm.runtime_patches.{n}" for n in expected])


@pytest.mark.parametrize("cuda,installed,expected", [
    (False, (), ALL),
    (True, (), ["triton_stub", "distopt_load", "clip_vit_norm", "checkpoint_object_args",
                "destroy_resets_embedding_ranks", "typing_override", "prebuilt_helpers",
                "help_percent", "tp_partial_grads", "defer_wgrad_local_linears"]),
    (True, ("apex",), ["triton_stub", "clip_vit_norm", "checkpoint_object_args",
                       "destroy_resets_embedding_ranks", "typing_override",
                       "prebuilt_helpers", "help_percent", "tp_partial_grads",
                       "defer_wgrad_local_linears"]),
    (True, ("transformer_engine",), ["triton_stub", "checkpoint_object_args",
                                     "destroy_resets_embedding_ranks", "typing_override",
                                     "prebuilt_helpers", "help_percent", "tp_partial_grads",
                       "defer_wgrad_local_linears"]),
    (False, ("transformer_engine",),
     [n for n in ALL if n not in ("distopt_load", "clip_vit_norm")]),
])
def test_each_patch_is_gated_on_the_condition_of_its_bug(cuda, installed, expected):
    from megatron_mm.runtime_patches.registry import is_needed

    assert [p.name for p in PATCHES if is_needed(p, cuda, lambda m: m in installed)] == expected


def _symbols(replaces: str) -> list[str]:
    """The code names in a ``Patch.replaces`` text (parenthesised remarks left out):
    backticked names, dotted or snake/Camel-case identifiers, and ``a/b`` alternatives."""
    text = re.sub(r"\([^)]*\)", " ", replaces)
    names = []
    for ticked, word, alternative in re.findall(
            r"`([^`]+)`|(?<![/\w.])([A-Za-z_][\w.]*)|/([A-Za-z_][\w.]*)", text):
        name = ticked or alternative or word
        if ticked or alternative or "." in name or "_" in name or name != name.lower():
            names.append(name)
    return names


def _named(symbol: str, doc: str) -> bool:
    tail = ".".join(symbol.split(".")[-2:])  # e.g. ``Tensor.cuda``, ``random._get_cuda_rng_state``
    return re.search(rf"(?<![\w]){re.escape(tail)}(?![\w])", doc) is not None


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("patch", PATCHES, ids=ALL)
def test_docstring_names_version_and_replaced_symbols(patch):
    assert CHECKED_MEGATRON_CORE == "0.19.2" == version("megatron-core")
    doc = importlib.import_module(f"megatron_mm.runtime_patches.{patch.module}").__doc__
    assert doc and "0.19.2" in doc, f"{patch.name}: the docstring must name megatron-core 0.19.2"
    symbols = _symbols(patch.replaces)
    assert symbols, patch.replaces
    missing = [s for s in symbols if not _named(s, doc)]
    assert not missing, f"{patch.name}: docstring does not name {missing}"
    for symbol in symbols:  # fully qualified names must exist in the checked versions
        if symbol.startswith(("megatron.", "torch.")):
            _resolve(symbol)
