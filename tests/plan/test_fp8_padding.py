"""The FP8 sequence padding rule: least common multiple of the SP and CP factors and the
FP8 alignment of each rank's shard (each must hold at once); TE's GEMM dims check."""

import pytest

from megatron_mm.plan.errors import PlanError
from megatron_mm.plan.fp8 import (
    fp8_align_size,
    fp8_dtypes,
    fp8_gemm_dims_error,
    module_keys,
    parse_fp8_modules,
    sequence_multiple,
)


def test_align_size_is_megatron_cores():
    assert fp8_align_size("delayed") == fp8_align_size("tensorwise") == 16
    assert fp8_align_size("blockwise") == 16
    assert fp8_align_size("mxfp8") == 32


def test_cp_blocks_with_fp8():
    """Our CP split deals whole blocks: with FP8 the length is whole blocks and a block
    holds the alignment on every TP rank."""
    from megatron_mm.plan.fp8 import cp_block_error

    assert sequence_multiple("delayed", 2, True, 2, context_parallel_block=128) == 128
    assert sequence_multiple("delayed", 1, False, 2, context_parallel_block=48) == 96
    assert sequence_multiple(None, 2, True, 2, context_parallel_block=48) == 4  # no FP8
    assert cp_block_error("delayed", 2, True, 16) is not None  # 8 rows a TP rank
    assert cp_block_error("delayed", 2, True, 32) is None
    assert cp_block_error("mxfp8", 1, False, 16) is not None


@pytest.mark.parametrize("recipe, tp, sp, cp, multiple", [
    (None, 4, False, 1, 1),          # nothing to align
    ("delayed", 1, False, 1, 16),
    ("mxfp8", 1, False, 1, 32),
    (None, 4, True, 1, 4),           # SP: TP ranks split the sequence
    # FP8 under SP: each rank's shard (S / TP rows a sample) aligned, as TE checks it
    # before the all-gather; lcm(16, 4) = 16 gave 12 rows a rank at S = 48
    ("delayed", 4, True, 1, 64),
    ("delayed", 3, True, 1, 48),
    ("delayed", 6, True, 1, 96),
    (None, 1, False, 3, 6),          # CP: 2 chunks per CP rank
    ("delayed", 1, False, 3, 48),    # 16 a CP rank; Megatron-LM's get_padding gives 6 here
    ("mxfp8", 2, True, 4, 256),      # 32 a rank of CP 4 x SP 2
    ("delayed", 3, True, 5, 240),    # 16 x 3 x 5
    ("delayed", 4, False, 1, 16),    # TP without SP: the sequence is not split
])
def test_sequence_multiple(recipe, tp, sp, cp, multiple):
    got = sequence_multiple(recipe, tp, sp, cp)
    assert got == multiple
    # and every factor divides it
    if sp:
        assert got % tp == 0
    if cp > 1:
        assert got % (2 * cp) == 0
    if recipe:  # each rank's shard of a micro-batch of 1 passes TE's check
        local = got // (cp * (tp if sp else 1))
        assert local % fp8_align_size(recipe) == 0
        assert fp8_gemm_dims_error((local, 1, 64), recipe) is None


@pytest.mark.parametrize("shape, recipe, bad", [
    ((12, 1, 64), "delayed", True),    # the review's example: S 48 / TP 4 at micro-batch 1
    ((12, 2, 64), "delayed", False),   # 24 rows
    ((16, 1, 24), "tensorwise", True),  # last dim not a multiple of 16
    ((64, 48), "delayed", False),      # a weight [out, in]
    ((16, 1, 64), "mxfp8", True),      # MXFP8's 32-blocks
    ((32, 1, 64), "mxfp8", False),
])
def test_te_gemm_dims_check(shape, recipe, bad):
    """TE's ``assert_dim_for_fp8_exec`` (and MXFP8's quantizer check), hand-checked."""
    assert (fp8_gemm_dims_error(shape, recipe) is not None) == bad


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
