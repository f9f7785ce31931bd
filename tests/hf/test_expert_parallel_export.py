"""A converted MoE checkpoint loaded and saved again at EP=2 (each rank writes half of the
experts) exports to the Hugging Face tensors it came from, bit for bit."""

import shutil

import pytest
import torch
from dist_harness import run_distributed

pytestmark = pytest.mark.processes


def save_at(rank, ckpt, out, tp, pp, ep):
    """Load ``ckpt`` at TP / PP / EP and save it to ``out`` (iteration 0, weights only)."""
    import dataclasses

    from megatron_mm.hf.compare import _Layout, checkpoint_run_config, load_converted
    from megatron_mm.training.checkpointing import save_checkpoint, saved_args
    from megatron_mm.training.initialize import initialize_distributed, set_random_seed

    initialize_distributed(_Layout(tp, pp, ep))
    set_random_seed(1234)
    model = load_converted(ckpt, tp, pp, ep)
    config = checkpoint_run_config(ckpt, tp, pp, ep)
    config = dataclasses.replace(config, checkpoint=dataclasses.replace(
        config.checkpoint, save=out, load=None, no_save_optim=True, no_save_rng=True))
    padded = saved_args(checkpoint_run_config(ckpt, tp, pp, ep).checkpoint)
    save_checkpoint(config, 0, [model], None, None,
                    run_state={"padded_vocab_size": padded["padded_vocab_size"]})


def test_checkpoint_saved_at_ep2_exports_the_same_tensors(gloo_world, converted, tmp_path):
    from megatron_mm.hf.convert import HF_SUBDIR, export_hf

    original, _, ckpt = converted["qwen3_moe"]
    resaved = str(tmp_path / "ep2")
    run_distributed(save_at, 2, ckpt, resaved, 1, 1, 2)
    shutil.copytree(f"{ckpt}/{HF_SUBDIR}", f"{resaved}/{HF_SUBDIR}")
    out = export_hf(resaved, str(tmp_path / "exported"))
    reloaded = type(original).from_pretrained(out, dtype=torch.float32)
    want, got = original.state_dict(), reloaded.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key
