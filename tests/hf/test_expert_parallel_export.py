"""A converted MoE checkpoint loaded and saved again at EP=2 (each rank writes half of the
experts) exports to the Hugging Face tensors it came from, bit for bit."""

import pytest
import torch
from resave_workers import export_saved_at

pytestmark = pytest.mark.processes


def test_checkpoint_saved_at_ep2_exports_the_same_tensors(gloo_world, converted, tmp_path):
    original, _, ckpt = converted["qwen3_moe"]
    out = export_saved_at(ckpt, str(tmp_path), 1, 1, 2)
    reloaded = type(original).from_pretrained(out, dtype=torch.float32)
    want, got = original.state_dict(), reloaded.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key
