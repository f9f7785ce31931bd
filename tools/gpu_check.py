"""Check a single-GPU node without internet access: ``make gpu-check`` (docs/gpu.md).

    make gpu-wheels                    # on a connected machine: the wheels the node lacks
    make gpu-check WHEELS=gpu-wheels   # on the node: install them, run the checks
    python tools/gpu_check.py --dry-run    # anywhere: the plan and its time budget

The node has Python 3.12 and a CUDA build of torch. Each check runs as its own process
under its time budget (the budgets add up to at most 9 minutes on one H100), in order:

- ``install``: the wheels (``--no-index --no-deps``) and this checkout (editable, no build
  isolation: the node's torch stays), then every module the checks import;
- ``smoke``: a bf16 matmul, an NCCL world of one, the patches a CUDA machine needs
  (``tools/gpu_smoke.py``);
- ``sync-free-step``: one training step of the default model, the Qwen2.5-VL tower, the
  Qwen3-VL model (interleaved M-RoPE, DeepStack) and an FP8-emulated LLM: every action of
  the schedule counted by ``tests/host_syncs.py``, which on CUDA records each
  ``torch.cuda.set_sync_debug_mode`` warning (all of them listed, not the first raised)
  (``tests/training/loop/test_host_syncs.py``);
- ``demo``: ``make demo``'s run on the GPU (bf16), to its held-out answer accuracy;
- ``profile-layers``: ``tools/profile_layers.py`` at hidden sizes 4096 and 8192 (768
  samples a micro-batch): the LLM layers' forward time must scale with their FLOPs
  (about 4x), not stay flat;
- ``bench-gpu``: ``tools/bench_gpu.py`` at hidden size 2048, ours (local layers, bf16)
  against Megatron-Core's ``LLaVAModel``: tokens/s, MFU, peak memory, the same loss;
- ``flex-attention``: a few training steps of a tiny model with ``--media-attention
  bidirectional`` and with packed samples on FlexAttention (one GPU, CP=1) against the
  local path: the same losses and gradients (``tests/gpu/test_flex_training.py``), and
  the kernels compiled for flex_attention in that process, of Dynamo's recompile limit;
  LoRA's adapters trained on FlexAttention with the causal mask (``auto``'s pick for
  LoRA's local layers on CUDA) against the local path (``tests/gpu/test_lora_flex.py``);
- ``fla``: where flash-linear-attention imports, its varlen GDN kernels given the packed
  lengths on the host (``cu_seqlens_cpu``) run forward and backward with no host sync,
  and the package's GDN layer passes them (``tests/gpu/test_fla_gdn.py``); ABSENT, not
  failed, where FLA does not import;
- ``transformer-engine``: ``tests/gpu`` and ``bench_gpu``'s TE rows where TE imports;
  reported ABSENT, not failed, where it does not.

It writes ``report.json`` and ``report.md`` (versions, PASS/FAIL/ABSENT per check,
seconds, figures) and each check's log under ``--out``, and exits 1 when a required check
fails or runs out of time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
TOTAL_BUDGET_S = 540  # the whole check on one H100, the install included
PASS, FAIL, ABSENT, SKIPPED = "PASS", "FAIL", "ABSENT", "SKIPPED"
DEMO_ACCURACY = 0.90  # make demo's held-out answer accuracy (README)
FLOP_SCALING = (2.5, 6.0)  # forward time 8192 / 4096: FLOPs give ~4x, launches ~1x


@dataclasses.dataclass
class Result:
    status: str
    figures: Dict[str, object] = dataclasses.field(default_factory=dict)
    detail: str = ""


@dataclasses.dataclass
class Check:
    name: str
    budget_s: int
    what: str
    commands: Callable[["Context"], List[List[str]]]
    judge: Callable[["Context", List[subprocess.CompletedProcess]], Result]
    required: bool = True
    needs_te: bool = False


@dataclasses.dataclass
class Context:
    python: str
    out: Path
    wheels: Optional[Path]
    demo_flags: List[str]
    te: bool = False  # Transformer Engine imports (found by the install check)

    def py(self, *argv: str) -> List[str]:
        return [self.python, *argv]


# --- the checks -------------------------------------------------------------------------

# megatron_mm's entry call first (it applies the patches megatron.core needs on this
# machine), then the imports. A "?" marks a package that need only be found
# (mistral_common: the demo's tokenizer file).
IMPORTS = ("torch", "megatron_mm.training.pretrain", "megatron.core", "transformers",
           "safetensors", "einops", "sentencepiece", "sklearn", "PIL", "scipy", "pytest",
           "?mistral_common")
PROBE = ("import importlib, importlib.util, json, sys\n"
         "missing = {}\n"
         "try:\n"
         "    from megatron_mm.startup import prepare_megatron_core\n"
         "    prepare_megatron_core()\n"
         "except Exception as e: missing['megatron_mm'] = f'{type(e).__name__}: {e}'\n"
         "for m in sys.argv[1:]:\n"
         "    try:\n"
         "        if m[0] != '?': importlib.import_module(m)\n"
         "        elif importlib.util.find_spec(m[1:]) is None: raise ImportError('not found')\n"
         "    except Exception as e: missing[m.lstrip('?')] = f'{type(e).__name__}: {e}'\n"
         "from importlib.metadata import version, PackageNotFoundError\n"
         "def v(p):\n"
         "    try: return version(p)\n"
         "    except PackageNotFoundError: return None\n"
         "import torch\n"
         "te_error = None\n"
         "try: import transformer_engine.pytorch\n"
         "except Exception as e: te_error = f'{type(e).__name__}: {e}'\n"
         "print(json.dumps({'missing': missing, 'python': sys.version.split()[0],\n"
         "  'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
         "  'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None,\n"
         "  'megatron_core': v('megatron-core'), 'transformers': v('transformers'),\n"
         "  'transformer_engine': v('transformer-engine') or v('transformer_engine'),\n"
         "  'te_error': te_error}))\n")


def install_commands(ctx: Context) -> List[List[str]]:
    cmds = []
    if ctx.wheels is not None:
        wheels = sorted(str(p) for p in ctx.wheels.glob("*.whl"))
        pip = ctx.py("-m", "pip", "install", "-q", "--no-index", "--no-deps",
                     "--no-build-isolation", "--no-cache-dir")
        cmds += [pip + wheels, pip + ["-e", str(ROOT)]]
    return cmds + [ctx.py("-c", PROBE, *IMPORTS)]


def judge_install(ctx: Context, procs) -> Result:
    failed = [p for p in procs if p.returncode != 0]
    if failed:
        return Result(FAIL, detail=f"{shlex.join(failed[0].args[:6])} ... exited "
                      f"{failed[0].returncode}: {tail(failed[0])}")
    info = last_json(procs[-1].stdout)
    ctx.te = info.get("te_error") is None
    figures = {k: info[k] for k in ("python", "torch", "cuda", "gpu", "megatron_core",
                                    "transformers", "transformer_engine")}
    figures["te_error"] = info.get("te_error")
    if info["missing"]:
        return Result(FAIL, figures, "missing on this node (add their wheels to "
                      f"make gpu-wheels): {info['missing']}")
    return Result(PASS, figures)


def judge_smoke(ctx: Context, procs) -> Result:
    info = last_json(procs[0].stdout)
    figures = {}
    if "matmul" in info:
        figures.update(bf16_matmul_tflops=info["matmul"].get("bf16_matmul_tflops"),
                       nccl=info.get("nccl", {}).get("nccl_version"),
                       patches_applied=info.get("patches", {}).get("patches_applied"))
    ok = procs[0].returncode == 0 and info.get("ok")
    return Result(PASS if ok else FAIL, figures,
                  "" if ok else info.get("error") or f"failed: {info.get('failed')}")


def sync_free_commands(ctx: Context) -> List[List[str]]:
    return [ctx.py("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                   "tests/training/loop/test_host_syncs.py", "-k",
                   "default or qwen2_5_vl or qwen3_vl or fp8_emulated or dense-mask")]


def judge_pytest(ctx: Context, procs) -> Result:
    proc = procs[0]
    summary = pytest_summary(proc.stdout)
    if proc.returncode == 0 and summary.get("passed", 0) > 0:
        return Result(PASS, summary)
    # the assertion lines first: the output's end is warnings and the summary
    errors = [line for line in proc.stdout.splitlines() if line.startswith(("E ", "FAILED"))]
    return Result(FAIL, summary, "\n".join(errors)[-2500:] or tail(proc))


def demo_commands(ctx: Context) -> List[List[str]]:
    save = ctx.out / "demo" / "checkpoints"
    return [ctx.py("-m", "torch.distributed.run", "--nproc-per-node", "1",
                   "examples/pretrain_mllm.py", *replace_flag(ctx.demo_flags, "--save",
                                                              str(save)), "--bf16")]


def judge_demo(ctx: Context, procs) -> Result:
    found = re.findall(r"val answer accuracy: ([0-9.]+)", procs[0].stdout)
    iteration = re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", procs[0].stdout)
    figures = {"val_answer_accuracy": float(found[-1]) if found else None,
               "ms_per_iteration": float(iteration[-1]) if iteration else None}
    if procs[0].returncode != 0 or not found:
        return Result(FAIL, figures, tail(procs[0]))
    ok = figures["val_answer_accuracy"] >= DEMO_ACCURACY
    return Result(PASS if ok else FAIL, figures,
                  "" if ok else f"accuracy below {DEMO_ACCURACY}")


PROFILE_SIZES = (4096, 8192)
# Enough work per layer that kernels, not launches, set its time. A micro-batch is as long
# as its longest sample (23 tokens in the demo's data), not --seq-length: 8 samples timed
# ~3.6 ms per LLM layer at hidden 2048 and 4096 alike on an H100 (the host's launches);
# 768 samples (17.7K tokens) timed 14.9 and 51.9 ms at 4096 and 8192 (~600 TFLOP/s).
PROFILE_TOKENS = (("--micro-batch-size", 768), ("--global-batch-size", 768))


def profile_commands(ctx: Context) -> List[List[str]]:
    base = replace_flag(replace_flag(ctx.demo_flags, "--save", None), "--save-interval", None)
    cmds = []
    for h in PROFILE_SIZES:
        flags = base
        for flag, value in (("--hidden-size", h), ("--ffn-hidden-size", 4 * h),
                            ("--num-attention-heads", 32), ("--num-query-groups", 8),
                            *PROFILE_TOKENS):
            flags = replace_flag(flags, flag, str(value))
        cmds.append(ctx.py("tools/profile_layers.py", *flags, "--bf16", "--profile-out",
                           str(ctx.out / f"profile-{h}.json")))
    return cmds


def judge_profile(ctx: Context, procs) -> Result:
    failed = [p for p in procs if p.returncode != 0]
    if failed:
        return Result(FAIL, detail=tail(failed[0]))
    forward = {}
    for h in PROFILE_SIZES:
        layers = json.loads((ctx.out / f"profile-{h}.json").read_text())["layers"]
        forward[h] = sum(t["forward_s"] for t in layers
                         if t["module"].startswith("language_model.decoder"))
    ratio = forward[PROFILE_SIZES[1]] / forward[PROFILE_SIZES[0]]
    figures = {f"llm_layers_forward_ms_h{h}": round(1e3 * s, 3) for h, s in forward.items()}
    figures["ratio"] = round(ratio, 2)
    low, high = FLOP_SCALING
    ok = low <= ratio <= high
    return Result(PASS if ok else FAIL, figures,
                  "" if ok else f"forward time ratio {ratio:.2f} outside [{low}, {high}]: "
                  "the timers do not follow the kernels")


BENCH_SIZES = ["--hidden-size", "2048", "--num-attention-heads", "16", "--num-query-groups",
               "8", "--ffn-hidden-size", "5632", "--num-layers", "4", "--seq-length", "2048",
               "--micro-batch-size", "2", "--vision-hidden-size", "1024",
               "--vision-num-attention-heads", "16", "--vision-num-layers", "4",
               "--img-size", "336", "--steps", "8", "--warmup", "2"]


def bench_commands(ctx: Context, rows: str = "local-bf16,llava-bf16") -> List[List[str]]:
    return [ctx.py("tools/bench_gpu.py", *BENCH_SIZES, "--rows", rows)]


def judge_bench(ctx: Context, procs) -> Result:
    proc = procs[0]
    rows = bench_rows(proc.stdout)
    if proc.returncode != 0 or not rows:
        return Result(FAIL, {"rows": rows}, tail(proc))
    ran = {name: row for name, row in rows.items() if "step_ms" in row}
    ours = next((r for n, r in ran.items() if n.startswith("megatron_mm, local")), None)
    llava = next((r for n, r in ran.items() if n.startswith("megatron.core LLaVAModel")), None)
    figures: Dict[str, object] = {"rows": rows}
    if ours is None or llava is None:
        return Result(FAIL, figures, "the local and LLaVAModel rows must both run")
    figures["tokens_per_s_ours_over_llava"] = round(ours["tokens_per_s"]
                                                    / llava["tokens_per_s"], 3)
    same = abs(ours["loss"] - llava["loss"]) <= 2e-2 * max(1.0, abs(llava["loss"]))
    return Result(PASS if same else FAIL, figures,
                  "" if same else "ours and LLaVAModel end at different losses from the "
                  "same weights and batch")


FLEX_COMPILES = re.compile(r"flex_attention kernels compiled: (\d+) \(recompile limit (\d+)\)")


def judge_flex(ctx: Context, procs) -> Result:
    """judge_pytest, with the most kernels compiled for flex_attention in the process (of
    Dynamo's recompile limit) the training test printed."""
    result = judge_pytest(ctx, procs)
    counts = [(int(n), int(limit)) for n, limit in FLEX_COMPILES.findall(procs[0].stdout)]
    if counts:
        result.figures["flex_compiles"], result.figures["recompile_limit"] = max(counts)
    elif result.status == PASS:
        return Result(FAIL, result.figures, "no flex_attention compile count in the output")
    return result


def flex_commands(ctx: Context) -> List[List[str]]:
    return [ctx.py("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                   "tests/gpu/test_flex_training.py", "tests/gpu/test_lora_flex.py")]


FLA_SYNCS = re.compile(r"(FLA varlen|GDN layer) syncs[^:]*: (\d+)( with [\w ]+)?")


def fla_commands(ctx: Context) -> List[List[str]]:
    return [ctx.py("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "-s",
                   "tests/gpu/test_fla_gdn.py")]


def judge_fla(ctx: Context, procs) -> Result:
    """judge_pytest, ABSENT where flash-linear-attention does not import (both skipped),
    with the host syncs the tests printed."""
    out = procs[0].stdout
    if procs[0].returncode == 0 and re.search(r"\d+ skipped", out) \
            and not re.search(r"\d+ passed", out):
        return Result(ABSENT, detail="flash-linear-attention does not import")
    result = judge_pytest(ctx, procs)
    for what, count, case in FLA_SYNCS.findall(procs[0].stdout):
        result.figures[f"{what}{case}".replace(" ", "_").lower() + "_syncs"] = int(count)
    return result


def te_commands(ctx: Context) -> List[List[str]]:
    return [ctx.py("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu",
                   "--deselect", "tests/gpu/test_flex_training.py",
                   "--deselect", "tests/gpu/test_lora_flex.py"),
            *bench_commands(ctx, "te-bf16,te-fp8")]


def judge_te(ctx: Context, procs) -> Result:
    tests, bench = judge_pytest(ctx, procs[:1]), judge_bench_te(procs[1])
    figures = {"tests": tests.figures, "bench": bench.figures}
    ok = tests.status == PASS and bench.status == PASS
    return Result(PASS if ok else FAIL, figures, tests.detail or bench.detail)


def judge_bench_te(proc) -> Result:
    rows = bench_rows(proc.stdout)
    ran = proc.returncode == 0 and rows and all("step_ms" in r for r in rows.values())
    return Result(PASS if ran else FAIL, {"rows": rows}, "" if ran else tail(proc))


CHECKS = [
    Check("install", 35, "the wheels and this checkout installed offline; every import",
          install_commands, judge_install),
    Check("smoke", 25, "bf16 matmul, NCCL world of one, the CUDA machine's patches",
          lambda ctx: [ctx.py("tools/gpu_smoke.py")], judge_smoke),
    Check("sync-free-step", 95, "one training step of the default model, the Qwen2.5-VL "
          "and Qwen3-VL models and an FP8-emulated LLM, every CUDA sync-debug warning "
          "recorded", sync_free_commands, judge_pytest),
    Check("demo", 110, f"the demo on the GPU to its held-out accuracy (>= {DEMO_ACCURACY})",
          demo_commands, judge_demo),
    Check("profile-layers", 85, "layer profile at hidden 4096 and 8192: forward time "
          f"scales with FLOPs (ratio in {list(FLOP_SCALING)})", profile_commands,
          judge_profile),
    Check("bench-gpu", 55, "bench_gpu at hidden 2048: ours (local bf16) vs Megatron-Core's "
          "LLaVAModel, tokens/s, MFU, peak memory", bench_commands, judge_bench),
    # compiles flex_attention's forward and backward Triton kernels first
    Check("flex-attention", 50, "a few training steps with bidirectional media, with "
          "packed samples and with LoRA (causal mask: auto's pick for LoRA's local layers) "
          "on FlexAttention against the local path: the same losses and gradients; the "
          "kernels compiled for flex_attention, of Dynamo's recompile limit",
          flex_commands, judge_flex),
    # FLA's Triton kernels compile and autotune first; not required (FLA is Qwen3.5's only)
    Check("fla", 20, "flash-linear-attention's varlen GDN kernels given the host lengths "
          "(cu_seqlens_cpu): no host sync forward or backward; the package's GDN layer "
          "passes them, where FLA imports", fla_commands, judge_fla, required=False),
    Check("transformer-engine", 65, "tests/gpu and bench_gpu's TE rows (bf16, FP8), where "
          "Transformer Engine imports", te_commands, judge_te, needs_te=True),
]


# --- running them -----------------------------------------------------------------------

def run_check(check: Check, ctx: Context, budget_s: float) -> Result:
    log = ctx.out / f"{check.name}.log"
    procs = []
    deadline = time.monotonic() + budget_s
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
               # torch.cuda.is_available() through NVML: a parent that forks GPU ranks
               # (forkserver, torchrun) must not initialise CUDA first
               PYTORCH_NVML_BASED_CUDA_CHECK="1", TOKENIZERS_PARALLELISM="false")
    if not ctx.te:
        env["MEGATRON_MM_GPU_TESTS_WITHOUT_TE"] = "1"
    with open(log, "w") as f:
        for cmd in check.commands(ctx):
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            left = deadline - time.monotonic()
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                      timeout=max(left, 1))
            except subprocess.TimeoutExpired as e:
                f.write(_text(e.stdout) + _text(e.stderr))
                return Result(FAIL, detail=f"ran out of its {budget_s:.0f} s budget in "
                              f"{shlex.join(cmd[:4])} ...")
            f.write(proc.stdout + proc.stderr)
            procs.append(proc)
    try:
        return check.judge(ctx, procs)
    except Exception as e:  # noqa: BLE001  (a report that cannot be read is a failure)
        return Result(FAIL, detail=f"could not read the check's output: "
                      f"{type(e).__name__}: {e}; see {log.name}")


def run_all(ctx: Context, names: List[str]) -> dict:
    ctx.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    report = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "node": platform.node(),
              "budget_s": TOTAL_BUDGET_S, "checks": []}
    for check in CHECKS:
        if check.name not in names:
            continue
        entry = {"name": check.name, "what": check.what, "required": check.required,
                 "budget_s": check.budget_s}
        left = TOTAL_BUDGET_S - (time.monotonic() - start)
        t0 = time.monotonic()
        if check.needs_te and not ctx.te:
            result = Result(ABSENT, detail="Transformer Engine does not import on this node")
        elif left < 5:
            result = Result(SKIPPED if not check.required else FAIL,
                            detail=f"no time left of the {TOTAL_BUDGET_S} s")
        else:
            result = run_check(check, ctx, min(check.budget_s, left))
        entry.update(status=result.status, seconds=round(time.monotonic() - t0, 1),
                     figures=result.figures, detail=result.detail, log=f"{check.name}.log")
        report["checks"].append(entry)
        write_report(ctx, report, start)  # after each check: a killed run still tells
        print(f"gpu-check: {check.name}: {result.status} ({entry['seconds']} s)"
              + (f": {result.detail.splitlines()[-1][:200]}" if result.detail else ""),
              flush=True)
        if check.name == "install" and result.status == FAIL:
            break  # nothing else can import
    return write_report(ctx, report, start)


def write_report(ctx: Context, report: dict, start: float) -> dict:
    report["seconds"] = round(time.monotonic() - start, 1)
    report["passed"] = all(c["status"] in (PASS, ABSENT, SKIPPED) or not c["required"]
                           for c in report["checks"])
    (ctx.out / "report.json").write_text(json.dumps(report, indent=1))
    (ctx.out / "report.md").write_text(report_markdown(report))
    return report


def report_markdown(report: dict) -> str:
    install = next((c for c in report["checks"] if c["name"] == "install"), None)
    lines = [f"# make gpu-check: {'PASS' if report['passed'] else 'FAIL'}", "",
             f"{report['started']}, node {report['node']}, {report['seconds']} s of "
             f"{report['budget_s']} s", ""]
    if install:
        lines += [", ".join(f"{k} {v}" for k, v in install["figures"].items()), ""]
    lines += ["| check | status | seconds (budget) | figures | detail |",
              "| --- | --- | --- | --- | --- |"]
    for c in report["checks"]:
        figures = "" if c["name"] == "install" else json.dumps(c["figures"])
        detail = c["detail"].replace("\n", " ")[-300:]
        lines.append(f"| {c['name']} | {c['status']} | {c['seconds']} ({c['budget_s']}) | "
                     f"{figures} | {detail} |")
    return "\n".join(lines) + "\n"


# --- reading outputs --------------------------------------------------------------------

def _text(out) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def tail(proc, n: int = 1500) -> str:
    return (proc.stdout + proc.stderr)[-n:]


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line in the output")


def pytest_summary(text: str) -> Dict[str, int]:
    """{'passed': n, 'failed': n, 'skipped': n, ...} from pytest's last line."""
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", lines[-1])} if lines else {}


def bench_rows(text: str) -> Dict[str, dict]:
    """tools/bench_gpu.py's table: row title -> its figures (or {'skipped': why})."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or cells[0] in ("row", "---") or len(cells) < 6:
            continue
        if cells[1].startswith("skipped"):
            rows[cells[0]] = {"skipped": cells[1]}
            continue
        mfu = None if cells[3] == "n/a" else float(cells[3].rstrip("%")) / 100
        rows[cells[0]] = dict(step_ms=float(cells[1]), tokens_per_s=float(cells[2]),
                              mfu=mfu, peak_mib=float(cells[4]), loss=float(cells[5]))
    return rows


def replace_flag(flags: List[str], flag: str, value: Optional[str]) -> List[str]:
    """``flags`` with ``flag``'s value replaced (appended if absent; dropped for None)."""
    out, i = [], 0
    while i < len(flags):
        if flags[i] == flag:
            i += 2
            continue
        out.append(flags[i])
        i += 1
    return out + ([flag, value] if value is not None else [])


def demo_flags() -> List[str]:
    """``make demo``'s flags: the Makefile's DEMO_FLAGS, ``--recipe demo`` (read from the file
    where the node has no make)."""
    try:
        proc = subprocess.run(["make", "-s", "-C", str(ROOT), "print-demo-flags"],
                              capture_output=True, text=True, check=True)
        return proc.stdout.split()
    except (OSError, subprocess.CalledProcessError):
        text = (ROOT / "Makefile").read_text()
        return re.search(r"^DEMO_FLAGS = (.*)$", text, re.M).group(1).split()


def dry_run(names: List[str], out) -> int:
    total = sum(c.budget_s for c in CHECKS if c.name in names)
    print(f"make gpu-check: {len(names)} checks, {total} s of budget "
          f"(limit {TOTAL_BUDGET_S} s), each its own process under its budget:", file=out)
    print("| check | budget s | required | what |", file=out)
    print("| --- | --- | --- | --- |", file=out)
    for c in CHECKS:
        if c.name in names:
            required = "where TE imports" if c.needs_te else ("yes" if c.required else "no")
            print(f"| {c.name} | {c.budget_s} | {required} | {c.what} |", file=out)
    return 0 if total <= TOTAL_BUDGET_S else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheels", type=Path, default=None,
                   help="folder of wheels to install first (make gpu-wheels); none: use "
                        "what is installed")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-check",
                   help="where report.json, report.md and the logs go")
    p.add_argument("--only", default=None,
                   help=f"comma-separated subset of {', '.join(c.name for c in CHECKS)}")
    p.add_argument("--demo-flags", default=None,
                   help="make demo's flags (default: make print-demo-flags)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the checks and their time budget; run nothing")
    args = p.parse_args(argv)
    known = [c.name for c in CHECKS]
    names = known if args.only is None else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in names if n not in known]
    if unknown:
        p.error(f"--only: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.dry_run:
        return dry_run(names, sys.stdout)
    if args.wheels is not None and not any(args.wheels.glob("*.whl")):
        p.error(f"--wheels {args.wheels}: no .whl files there (make gpu-wheels makes them)")
    flags = args.demo_flags.split() if args.demo_flags else demo_flags()
    ctx = Context(python=sys.executable, out=args.out.resolve(), wheels=args.wheels,
                  demo_flags=flags)
    report = run_all(ctx, names if "install" in names else ["install"] + names)
    print(f"gpu-check: {'PASS' if report['passed'] else 'FAIL'} in {report['seconds']} s; "
          f"{ctx.out / 'report.md'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
