"""A Makefile variable's flags as make gives them (continued lines joined, ``$(VAR)``
references to the Makefile's other variables expanded), for tests that run a demo's own
flags without starting make."""

import re
import shlex
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def makefile_flags(name: str) -> list:
    text = MAKEFILE.read_text().replace("\\\n", " ")
    values = dict(re.findall(r"^([A-Z_0-9]+)\s*=(.*)$", text, flags=re.M))

    def expand(value: str) -> str:
        return re.sub(r"\$\(([A-Z_0-9]+)\)", lambda m: expand(values[m.group(1)]), value)

    return shlex.split(expand(values[name]))
