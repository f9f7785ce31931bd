"""tools/plan.py with a hybrid LLM: Megatron-LM's Gated DeltaNet flags, the Qwen3.5 pair
and table, and a bad --linear-attention-freq (in process: the planner is pure Python)."""

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "plan.py"
SIZES = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "8",
         "--vocab-size", "1000", "--swiglu", "--pipeline-model-parallel-size", "2",
         "--seq-length", "32768", "--num-microbatches", "8", "--linear-num-key-heads", "4",
         "--linear-num-value-heads", "8", "--linear-key-head-dim", "32",
         "--linear-value-head-dim", "32"]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("plan_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def auto_row(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("| auto |"))


def test_linear_attention_flags_move_the_partition(tool, capsys):
    assert tool.main(SIZES) == 0
    full = auto_row(capsys.readouterr().out)
    assert tool.main(SIZES + ["--experimental-attention-variant", "gated_delta_net",
                              "--linear-attention-freq", "1,0,1,1,1,1,1,1"]) == 0
    hybrid = auto_row(capsys.readouterr().out)
    # at 32K tokens full-attention layer 1 outweighs the six Gated DeltaNet layers after
    # it: the first stage ends with it (embedding, layers 0-1)
    assert full.split(" | ")[1] == "5,5" and hybrid.split(" | ")[1] == "3,7"


def test_qwen35_table_and_pair(tool, capsys):
    assert tool.main(["--qwen35-table"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("| 131072")]
    assert [l.split(" | ")[1] for l in lines] == ["uniform", "auto, attention-only costs",
                                                  "auto"]
    assert tool.main(["--model-pair", "Qwen3.5-27B", "--pipeline-model-parallel-size", "2",
                      "--num-microbatches", "4"]) == 0
    out = capsys.readouterr().out
    assert "qwen3.5-27b" in out
    assert "Gated DeltaNet  x48" in out and "full attention  x16" in out


def test_bad_linear_attention_freq_is_one_line(tool, capsys):
    with pytest.raises(SystemExit) as exit_:
        tool.main(SIZES + ["--experimental-attention-variant", "gated_delta_net",
                           "--linear-attention-freq", "1,2"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(": error: --linear-attention-freq as a list takes one 0/1 per "
                        "layer (--num-layers 8), got [1, 2]")


def test_context_parallel_of_the_hybrid_llm(tool, capsys):
    """--context-parallel-size for a hybrid LLM: its GDN heads checked over TP x CP, its
    work and all-to-alls per CP rank printed (the bytes of plan/context_parallel/hybrid)."""
    pair = ["--model-pair", "Qwen3.5-27B", "--pipeline-model-parallel-size", "2",
            "--num-microbatches", "4", "--tensor-model-parallel-size", "4",
            "--seq-length", "32768"]
    assert tool.main(pair + ["--context-parallel-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "context parallelism 2 (TP 4): tokens per rank [16384, 16384] of 32768" in out
    # 16384 tokens a rank: (8240 + 3072) channels of each / TP 4, bf16
    mib = 16384 * (8240 + 3072) * 2 / 4 / 2 ** 20
    assert f"all-to-alls {mib:.1f} MiB per layer forward" in out
    assert f"{96 * mib / 1024:.2f} GiB per micro-batch" in out
    with pytest.raises(SystemExit) as exit_:
        tool.main(pair + ["--context-parallel-size", "8"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(": error: --linear-num-key-heads (16) is not divisible by "
                        "--tensor-model-parallel-size x --context-parallel-size (4 x 8): "
                        "the Gated DeltaNet layers run head-parallel over the CP ranks")
