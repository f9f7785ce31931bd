"""The package as a user gets it: a wheel built from the repository holds every module of
``megatron_mm``, and installed on its own (not editable, the source tree out of reach)
imports each of them and runs ``examples/pretrain_mllm.py --help``; one supported Python
range in ``pyproject.toml``, the Makefile and the README."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What the build must not see: VCS data, environments, outputs, stale build folders.
TOP_LEVEL_NOT_SOURCE = {".git", ".venv", ".venv-lock", ".venv-latest", "build", "dist", "runs",
                        "checkpoints", "gpu-wheels", ".cache", ".pytest_cache"}


def not_source(folder, names):
    top = Path(folder) == ROOT
    return [n for n in names if (top and n in TOP_LEVEL_NOT_SOURCE) or n == "__pycache__"
            or n.endswith(".egg-info")]


def source_files(data: bool = False) -> list[str]:
    """Every module (``data``: every other file) of the source tree, as a path under the
    package root."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "megatron_mm").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts
                  and (p.suffix == ".py") != data)


def module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


# Imports every module of the installed copy (prepared first, as the entry points are)
# and fails when one comes from elsewhere: an editable install's finder serves a module a
# wheel lacks from its source tree.
IMPORT_ALL = """
import importlib, sys
from pathlib import Path
site = Path(sys.argv[1]).resolve()
from megatron_mm.startup import prepare_megatron_core
prepare_megatron_core()
for name in sys.argv[2:]:
    importlib.import_module(name)
elsewhere = sorted(f"{n}: {m.__file__}" for n, m in sys.modules.items()
                   if n.split(".")[0] == "megatron_mm"
                   and not Path(m.__file__).resolve().is_relative_to(site))
assert not elsewhere, "not from the installed wheel: " + ", ".join(elsewhere)
"""


@pytest.mark.processes
def test_wheel_installs_and_imports_every_module(tmp_path):
    src = tmp_path / "src"  # a clean copy: an in-tree build writes build/ and *.egg-info
    shutil.copytree(ROOT, src, ignore=not_source)
    dist, site, outside = tmp_path / "dist", tmp_path / "site", tmp_path / "outside"
    outside.mkdir()
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, cwd=tmp_path, timeout=120)
    (wheel,) = dist.glob("megatron_mm-*.whl")

    modules, data = source_files(), source_files(data=True)
    names = zipfile.ZipFile(wheel).namelist()
    in_wheel = sorted(n for n in names if n.endswith(".py"))
    assert in_wheel == modules, (f"missing from the wheel: {sorted(set(modules) - set(in_wheel))}"
                                 f"; extra: {sorted(set(in_wheel) - set(modules))}")
    assert set(data) <= set(names), f"data missing from the wheel: {set(data) - set(names)}"

    # Its dependencies are those of this environment (a fresh one would need the network).
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, cwd=tmp_path, timeout=120)
    env = {**os.environ, "PYTHONPATH": str(site)}

    def run(*argv):  # from a folder outside the repository, so nothing of it is on sys.path
        return subprocess.run([sys.executable, *argv], cwd=outside, env=env, text=True,
                              capture_output=True, timeout=180)

    proc = run("-c", IMPORT_ALL, str(site), *map(module_name, modules))
    assert proc.returncode == 0, proc.stderr[-3000:]

    script = shutil.copy(ROOT / "examples" / "pretrain_mllm.py", outside)
    proc = run(script, "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--tensor-model-parallel-size" in proc.stdout


def test_one_python_range():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    (make_min,) = re.findall(r"^PYTHON_MIN := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert requires == f">={make_min}"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"need Python {make_min} or newer" in readme
