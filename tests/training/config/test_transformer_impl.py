"""``--transformer-impl`` on a CUDA machine whose Transformer Engine does not import: asked
for or defaulted to, TE stops the run with TE's own error and the flag that selects local
layers, never a silent fallback to them. CUDA is faked (``torch.cuda.is_available``), TE is
a package on ``sys.path`` whose import raises ``ModuleNotFoundError`` (a dependency of TE's
missing): the failure Megatron-Core survives, running on without TE (any other breaks
``import megatron.core`` itself: ``tests/test_te_import.py``)."""

import importlib

import pytest
import torch

from megatron_mm import te_import
from megatron_mm.config import ConfigError
from megatron_mm.models import specs
from megatron_mm.training.cli.arguments import parse_args
from megatron_mm.training.assembly.build_settings import build_settings
from megatron_mm.training.config.run_config import RunConfig
from megatron_mm.training.cli.arguments import parse_run_config

TE_ERROR = "No module named 'transformer_engine_torch'"


@pytest.fixture
def install_te(tmp_path, monkeypatch):
    """Installs a TE whose import raises ``TE_ERROR`` (``install_te("broken")``) or none
    (``install_te(None)``)."""
    def install(kind):
        if kind == "broken":
            pkg = tmp_path / "transformer_engine"
            pkg.mkdir()
            (pkg / "__init__.py").write_text(f"raise ModuleNotFoundError({TE_ERROR!r})\n")
            monkeypatch.syspath_prepend(str(tmp_path))
        te_import.import_exception.cache_clear()

    yield install
    monkeypatch.undo()
    importlib.invalidate_caches()
    te_import.import_exception.cache_clear()


@pytest.fixture
def cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.mark.parametrize("argv, defaulted", [([], True),
                                             (["--transformer-impl", "transformer_engine"],
                                              False)])
def test_broken_te_stops_the_run_with_its_error(install_te, cuda, argv, defaulted):
    install_te("broken")
    args = parse_args(argv, world_size=1)
    with pytest.raises(ConfigError) as error:
        build_settings(RunConfig.from_flags(args))
    message = str(error.value)
    assert TE_ERROR in message and "--transformer-impl local" in message, message
    assert ("the default where CUDA runs" in message) == defaulted, message
    assert "--no-build-isolation" in message


def test_broken_te_leaves_local_layers_asked_for(install_te, cuda):
    install_te("broken")
    args = parse_args(["--transformer-impl", "local"], world_size=1)
    assert build_settings(RunConfig.from_flags(args)).transformer_impl == "local"


def test_without_te_the_default_is_local(install_te, cuda):
    """A CUDA node without TE (``make gpu-check`` reports TE absent there) trains on local
    layers by default."""
    install_te(None)
    if specs.transformer_engine_installed():
        pytest.skip("Transformer Engine is installed here")
    assert specs.default_transformer_impl() == "local"
    assert build_settings(parse_run_config([], world_size=1)).transformer_impl == "local"


def test_without_cuda_te_is_refused_naming_the_flag(install_te):
    install_te("broken")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    assert specs.default_transformer_impl() == "local"
    with pytest.raises(ConfigError, match="needs a CUDA device: pass --transformer-impl local"):
        build_settings(parse_run_config(["--transformer-impl", "transformer_engine"],
                                        world_size=1))
