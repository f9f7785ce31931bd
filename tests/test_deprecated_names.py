"""Public names that moved keep working from their old place (docs/api.md: stable), with a
DeprecationWarning naming the new one."""

import importlib

import pytest


@pytest.mark.parametrize("old, name, new", [
    ("megatron_mm.patches", "apply_cpu_patches", "megatron_mm.runtime_patches"),
    ("megatron_mm.training.run_config", "parse_run_config", "megatron_mm.training.cli.arguments"),
    ("megatron_mm.training.run_config", "RunConfig", "megatron_mm.training.config.run_config"),
])
def test_old_name_is_the_new_one(old, name, new):
    with pytest.warns(DeprecationWarning, match=new.rsplit(".", 1)[0]):
        module = importlib.reload(importlib.import_module(old))
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
