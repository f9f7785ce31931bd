"""The lock (``requirements-lock.txt``): one exact version for every package the Makefile
installs, inside pyproject.toml's ranges, and in force in the environment that runs the
suite when the Makefile installed it from the lock (``make test``; ``make test-latest``
installs the newest releases and says so in ``.installed``)."""

import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements-lock.txt"


def locked() -> dict[str, Version]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version.strip(), f"requirements-lock.txt: {line!r} is not name==version"
        key = canonicalize_name(name)
        assert key not in pins, f"requirements-lock.txt names {name} twice"
        pins[key] = Version(version)
    return pins


def installed() -> dict[str, Version]:
    """The environment's packages (site-packages only: setuptools puts its vendored copies
    on sys.path once imported)."""
    site = sysconfig.get_paths()["purelib"]
    return {canonicalize_name(d.metadata["Name"]): Version(d.version)
            for d in metadata.distributions(path=[site]) if d.metadata["Name"] != "megatron-mm"}


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in ("test", "hf", "energon"):  # what the Makefile installs
        reqs += project["optional-dependencies"][extra]
    return [Requirement(r) for r in reqs]


def test_lock_satisfies_pyproject_ranges():
    pins = locked()
    for req in project_requirements():
        key = canonicalize_name(req.name)
        assert key in pins, f"{req.name} (pyproject.toml) is not in requirements-lock.txt"
        assert req.specifier.contains(pins[key], prereleases=True), \
            f"requirements-lock.txt has {req.name}=={pins[key]}, outside pyproject's {req}"


def test_every_installed_package_is_locked():
    """Transitive ones too: a package the lock misses would float on a fresh machine."""
    missing = sorted(set(installed()) - set(locked()))
    assert not missing, f"installed but not in requirements-lock.txt: {missing}"


def test_installed_versions_are_the_locked_ones():
    marker = Path(sys.prefix) / ".installed"
    if not marker.exists() or marker.read_text().strip() != LOCK.name:
        return  # not a Makefile install from the lock (make test-latest, a user's own env)
    pins, have = locked(), installed()
    # a CPU or CUDA build's local label (2.13.0+cpu) is the locked release
    off = {name: (str(pins[name]), str(v)) for name, v in have.items()
           if name in pins and Version(v.public) != pins[name]}
    assert not off, f"installed versions differ from requirements-lock.txt: {off}"
