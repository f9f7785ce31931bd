"""The FP8 sequence padding rule: least common multiple of the FP8 alignment and the SP
and CP factors (each must hold at once)."""

import pytest

from megatron_mm.plan.errors import PlanError
from megatron_mm.plan.fp8 import (
    fp8_align_size,
    fp8_dtypes,
    module_keys,
    parse_fp8_modules,
    sequence_multiple,
)


def test_align_size_is_megatron_cores():
    assert fp8_align_size("delayed") == fp8_align_size("tensorwise") == 16
    assert fp8_align_size("blockwise") == 16
    assert fp8_align_size("mxfp8") == 32


@pytest.mark.parametrize("recipe, tp, sp, cp, multiple", [
    (None, 4, False, 1, 1),          # nothing to align
    ("delayed", 1, False, 1, 16),
    ("mxfp8", 1, False, 1, 32),
    (None, 4, True, 1, 4),           # SP: TP ranks split the sequence
    ("delayed", 4, True, 1, 16),     # 4 divides 16
    ("delayed", 3, True, 1, 48),     # lcm(16, 3)
    ("delayed", 6, True, 1, 48),     # lcm(16, 6)
    (None, 1, False, 3, 6),          # CP: 2 chunks per CP rank
    ("delayed", 1, False, 3, 48),    # lcm(16, 6); Megatron-LM's get_padding gives 6 here
    ("mxfp8", 2, True, 4, 32),       # lcm(32, 2, 8)
    ("delayed", 3, True, 5, 240),    # lcm(16, 3, 10)
    ("delayed", 4, False, 1, 16),    # TP without SP: the sequence is not split
])
def test_sequence_multiple(recipe, tp, sp, cp, multiple):
    got = sequence_multiple(recipe, tp, sp, cp)
    assert got == multiple
    # and every factor divides it
    if recipe:
        assert got % fp8_align_size(recipe) == 0
    if sp:
        assert got % tp == 0
    if cp > 1:
        assert got % (2 * cp) == 0


def test_fp8_formats():
    assert fp8_dtypes("hybrid") == ("e4m3", "e5m2")
    assert fp8_dtypes("e4m3") == ("e4m3", "e4m3")


def test_module_keys():
    assert module_keys(["vision", "audio"]) == (
        "llm", "vision", "vision-projector", "audio", "audio-projector")
    assert parse_fp8_modules("all", ["vision"]) == ("llm", "vision", "vision-projector")
    assert parse_fp8_modules("llm, vision-projector,llm", ["vision"]) == (
        "llm", "vision-projector")
    with pytest.raises(PlanError, match="unknown module"):
        parse_fp8_modules("audio", ["vision"])
    with pytest.raises(PlanError):
        parse_fp8_modules("", ["vision"])


@pytest.mark.processes
def test_fp8_plan_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, megatron_mm.plan.fp8\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
