"""``tools/profile_layers.py`` on the Qwen towers: each layer of a Qwen3-VL tower whose
layer 0 feeds DeepStack runs with the batch's own layout (its frames, rotary angles) and
alone in its backward, and a Qwen3.5 hybrid LLM's layers are all timed; the profile it
writes loads as ``--pipeline-profile`` reads it."""

import os

import pytest
from qwen3_5_model import QWEN3_5_MODEL
from qwen_vl_data import write_qwen_vl_data
from tool_runs import run_tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "profile_layers.py")


@pytest.mark.processes
def test_profiles_a_deepstack_tower_and_a_hybrid_llm(tmp_path):
    from megatron_mm.plan.pipeline.profile import LayerProfile

    data = write_qwen_vl_data(str(tmp_path), n_train=8, n_valid=2, unit=32)
    deepstack = list(QWEN3_5_MODEL)
    deepstack.insert(deepstack.index("--vision-deepstack-visual-indexes") + 1, "0")
    out = tmp_path / "profile.json"
    proc = run_tool(TOOL, *deepstack, "--data-path", data, "--micro-batch-size", "2",
                    "--global-batch-size", "2", "--profile-micro-batches", "1",
                    "--profile-out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    profile = LayerProfile.load(str(out))
    timed = {t.module: t for t in profile.layers}
    for module in ("vision_model.decoder.layers.0", "vision_model.decoder.layers.1",
                   "vision_projection", *(f"language_model.decoder.layers.{i}"
                                          for i in range(4))):
        assert timed[module].forward_s > 0 and timed[module].backward_s > 0, module
