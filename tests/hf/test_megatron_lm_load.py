"""``tools/convert_hf.py import``'s checkpoint (a tiny LLaVA: CLIP + Llama) loads in
Megatron-LM's own pretrain with the package's provider (examples/megatron_lm/
pretrain_vlm.py: the Llama GPT from Megatron-LM's flags, the encoder from the checkpoint's
saved flags) and trains with the losses examples/pretrain_mllm.py gets from it."""

import pytest
from balanced_runs import small_digits
from dist_harness import run_distributed
from megatron_lm_runs import megatron_lm_flags, run_steps

pytestmark = [pytest.mark.processes, pytest.mark.slow]

# The tiny Llama's shape in Megatron-LM's flags (tiny_models._TEXT)
GPT = ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
       "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
       "--max-position-embeddings", "256", "--norm-epsilon", "1e-5",
       "--untie-embeddings-and-output-weights"]
RUN = ["--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "2",
       "--train-iters", "2", "--lr", "1e-3", "--lr-decay-style", "constant",
       "--weight-decay", "0.0", "--clip-grad", "1.0", "--seed", "1234", "--log-interval", "1",
       "--eval-iters", "0"]


def test_converted_checkpoint_trains_in_megatron_lm(gloo_world, digits_dir, tmp_path):
    import tiny_models
    from megatron_mm.hf.convert import import_hf
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    image_id, vocab = tiny_models.digits_tokenizer(hf_dir)
    tiny_models.build("llava_llama", vocab_size=vocab, image_token=image_id).save_pretrained(
        hf_dir)
    CLIPImageProcessorPil(size={"shortest_edge": 28},
                          crop_size={"height": 28, "width": 28}).save_pretrained(hf_dir)
    ckpt = str(tmp_path / "ckpt")
    import_hf(str(hf_dir), ckpt)
    data = ["--data-path", small_digits(digits_dir, str(tmp_path / "digits"), n=32)]
    ours, theirs = run_distributed(run_steps, 1, [
        ("ours", ["--load", ckpt, *data, *RUN]),
        ("megatron_lm", megatron_lm_flags(
            "--load", ckpt, "--no-load-optim", "--no-load-rng", *data, *RUN,
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", f"{ckpt}/hf",
            model=GPT))])[0]
    assert list(theirs["losses"]) == list(ours["losses"]) == [1, 2]
    for it in (1, 2):
        assert theirs["losses"][it] == pytest.approx(ours["losses"][it], rel=1e-5)
        assert theirs["grad_norms"][it] == pytest.approx(ours["grad_norms"][it], rel=1e-5)
