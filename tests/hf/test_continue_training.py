"""A converted LLaVA (with its tokenizer.json and CLIP preprocessor_config.json) continues
training with the pretrain script from ``--load`` alone, and the trained checkpoint
exports back to a directory transformers loads."""

import pytest
import torch
from dist_harness import run_distributed

pytestmark = pytest.mark.processes


def train(rank, argv):
    from megatron_mm.training.arguments import parse_args
    from megatron_mm.training.pretrain import pretrain
    from megatron_mm.training.run_config import RunConfig

    args = parse_args(argv, world_size=1)
    return pretrain(RunConfig.from_flags(args))["losses"], args.tokenizer_type


def test_converted_llava_continues_training(gloo_world, tmp_path):
    import transformers
    from megatron_mm.data.digits import prepare_digits
    from megatron_mm.hf.convert import export_hf
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    import tiny_models

    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    image_id, vocab = tiny_models.digits_tokenizer(hf_dir)
    model = tiny_models.build("llava_llama", vocab_size=vocab, image_token=image_id)
    model.save_pretrained(hf_dir)
    CLIPImageProcessorPil(size={"shortest_edge": 28},
                          crop_size={"height": 28, "width": 28}).save_pretrained(hf_dir)
    from megatron_mm.hf.convert import import_hf

    import_hf(str(hf_dir), str(tmp_path / "ckpt"))
    prepare_digits(tmp_path / "digits")
    losses, tokenizer_type = run_distributed(train, 1, [
        "--load", str(tmp_path / "ckpt"), "--save", str(tmp_path / "ckpt"),
        "--data-path", str(tmp_path / "digits"), "--micro-batch-size", "2",
        "--train-iters", "2", "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "1",
        "--skip-final-eval"])[0]
    assert tokenizer_type == "HuggingFaceTokenizer" and list(losses) == [1, 2]
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    # The trained iteration exports; transformers loads it, and the weights moved.
    out = export_hf(str(tmp_path / "ckpt"), str(tmp_path / "exported"))
    trained = transformers.LlavaForConditionalGeneration.from_pretrained(out)
    assert (trained.config.to_dict()["text_config"]["vocab_size"] == vocab)
    before, after = model.state_dict(), trained.state_dict()
    assert not torch.equal(before["lm_head.weight"], after["lm_head.weight"])
