"""``make gpu-check`` on a CPU machine: the dry run's plan fits its 8 minutes, a run without
CUDA fails its smoke check with a report that says why (and exits non-zero), TE's check is
ABSENT where TE does not import, and the judges read the real outputs of the tools they
run (bench_gpu's table, layer profiles)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_check  # noqa: E402


def _run(*argv, **kw):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.processes
def test_dry_run_plans_every_check_within_the_budget():
    proc = _run("--dry-run")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith(("| check", "| ---"))]
    budgets = {name.strip(): int(budget) for name, budget, *_ in rows}
    assert list(budgets) == [c.name for c in gpu_check.CHECKS]
    assert {"install", "smoke", "sync-free-step", "demo", "profile-layers", "bench-gpu",
            "flex-attention", "transformer-engine"} <= set(budgets)
    assert sum(budgets.values()) <= gpu_check.TOTAL_BUDGET_S
    assert f"{sum(budgets.values())} s of budget" in proc.stdout


@pytest.mark.processes
def test_make_target_dry_run():
    proc = subprocess.run(["make", "-s", "gpu-check", "DRY_RUN=1",
                           f"GPU_PYTHON={sys.executable}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| sync-free-step |" in proc.stdout


@pytest.mark.processes
def test_without_cuda_the_smoke_check_fails_and_the_report_says_why(tmp_path):
    proc = _run("--only", "smoke,transformer-engine", "--out", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    status = {c["name"]: c for c in report["checks"]}
    assert list(status) == ["install", "smoke", "transformer-engine"]  # install always first
    assert status["install"]["status"] == "PASS"
    assert status["install"]["figures"]["cuda"] is None
    assert status["smoke"]["status"] == "FAIL"
    assert "no CUDA device" in status["smoke"]["detail"]
    assert status["transformer-engine"]["status"] == "ABSENT"  # no TE here: not a failure
    assert report["passed"] is False
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# make gpu-check: FAIL") and "| smoke | FAIL |" in md
    assert (tmp_path / "smoke.log").read_text().startswith("$ ")


@pytest.mark.processes
def test_an_empty_wheels_folder_is_refused(tmp_path):
    proc = _run("--wheels", str(tmp_path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "--wheels" in proc.stderr and "no .whl" in proc.stderr


def test_bench_rows_reads_bench_gpus_table(capsys):
    import bench_gpu
    import torch

    rows = [dict(row="megatron_mm, local, bf16", step_ms=67.881, tokens_per_s=60340.4,
                 mfu=0.1061, peak_mib=12411.94, loss=8.378188),
            dict(row="megatron.core LLaVAModel, local, bf16", step_ms=75.9, tokens_per_s=53936,
                 mfu=None, peak_mib=12408.6, loss=8.378461),
            dict(row="megatron_mm, TE, bf16", skipped="skipped: Transformer Engine is not "
                 "importable")]
    args = bench_gpu.parse_args(["--steps", "2"])
    cfg = bench_gpu.bm.model_config(args)
    bench_gpu.print_table(rows, args, cfg, 1, 1, False, 1e12, None)
    parsed = gpu_check.bench_rows(capsys.readouterr().out)
    assert parsed["megatron_mm, local, bf16"] == dict(
        step_ms=67.881, tokens_per_s=60340.0, mfu=pytest.approx(0.106), peak_mib=12411.9,
        loss=8.378188)
    assert parsed["megatron.core LLaVAModel, local, bf16"]["mfu"] is None
    assert parsed["megatron_mm, TE, bf16"] == {"skipped": rows[2]["skipped"]}
    assert torch  # the table came from the tool itself, not a copy of its format


def _profile(path, llm_forward_s):
    from megatron_mm.plan.pipeline.profile import LayerProfile, LayerTime

    layers = [LayerTime("vision_model.decoder.layers.0", 1.0, 2.0)] + [
        LayerTime(f"language_model.decoder.layers.{i}", s, 2 * s)
        for i, s in enumerate(llm_forward_s)]
    LayerProfile(device="cuda", micro_batch_size=4, seq_length=1024,
                 tensor_model_parallel_size=1, frozen=[], layers=layers).save(str(path))


@pytest.mark.parametrize("forward_8192, status", [((0.0039, 0.0040), "PASS"),
                                                 ((0.0011, 0.0010), "FAIL")])
def test_profile_layers_is_judged_by_the_llm_layers_forward_ratio(tmp_path, forward_8192,
                                                                  status):
    _profile(tmp_path / "profile-4096.json", (0.001, 0.001))
    _profile(tmp_path / "profile-8192.json", forward_8192)
    ctx = gpu_check.Context(python=sys.executable, out=tmp_path, wheels=None, demo_flags=[])
    done = subprocess.CompletedProcess([], 0, "", "")
    result = gpu_check.judge_profile(ctx, [done, done])
    assert result.status == status
    assert result.figures["ratio"] == pytest.approx(sum(forward_8192) / 0.002, abs=0.01)


def test_replace_flag():
    flags = ["--save", "a", "--seq-length", "64", "--bf16"]
    assert gpu_check.replace_flag(flags, "--seq-length", "1024") == [
        "--save", "a", "--bf16", "--seq-length", "1024"]
    assert gpu_check.replace_flag(flags, "--save", None) == ["--seq-length", "64", "--bf16"]


def test_flex_check_reports_the_compile_count():
    """judge_flex reads tests/gpu/test_flex_training.py's line; a passing run without it
    fails (the count is what the check is for)."""
    out = ("flex_attention kernels compiled: 2 (recompile limit 8)\n"
           "flex_attention kernels compiled: 3 (recompile limit 8)\n2 passed in 30.1s\n")
    ctx = gpu_check.Context(python=sys.executable, out=ROOT, wheels=None, demo_flags=[])
    result = gpu_check.judge_flex(ctx, [subprocess.CompletedProcess([], 0, out, "")])
    assert result.status == "PASS"
    assert (result.figures["flex_compiles"], result.figures["recompile_limit"]) == (3, 8)
    silent = subprocess.CompletedProcess([], 0, "2 passed in 30.1s\n", "")
    assert gpu_check.judge_flex(ctx, [silent]).status == "FAIL"


def test_fla_check_is_absent_without_fla_and_reports_the_syncs():
    """judge_fla: both tests skipped (no FLA) is ABSENT; a run reports the syncs printed."""
    ctx = gpu_check.Context(python=sys.executable, out=ROOT, wheels=None, demo_flags=[])
    skipped = subprocess.CompletedProcess([], 0, "ss\n2 skipped in 0.3s\n", "")
    assert gpu_check.judge_fla(ctx, [skipped]).status == "ABSENT"
    out = ("FLA varlen syncs: 4 with cu_seqlens only\nFLA varlen syncs: 0 with cu_seqlens_cpu\n"
           "GDN layer syncs (forward and backward, packed): 1\n2 passed in 40.0s\n")
    result = gpu_check.judge_fla(ctx, [subprocess.CompletedProcess([], 0, out, "")])
    assert result.status == "PASS"
    assert result.figures["fla_varlen_with_cu_seqlens_only_syncs"] == 4
    assert result.figures["fla_varlen_with_cu_seqlens_cpu_syncs"] == 0
    assert result.figures["gdn_layer_syncs"] == 1
