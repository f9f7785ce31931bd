"""A converted LLaVA (with its tokenizer.json and CLIP preprocessor_config.json) continues
training with the pretrain script from ``--load`` alone, and the trained checkpoint
exports back to a directory transformers loads."""

import json

import pytest
import torch
from dist_harness import run_distributed

pytestmark = pytest.mark.processes


def train(rank, argv):
    import contextlib
    import io
    import warnings

    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.pretrain import pretrain
    from megatron_mm.training.config.run_config import RunConfig

    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
        args = parse_args(argv, world_size=1)
        losses = pretrain(RunConfig.from_flags(args))["losses"]
    return losses, args.tokenizer_type, out.getvalue(), [str(w.message) for w in caught]


def test_newcomer_path(gloo_world, tmp_path):
    """A newcomer's path, as docs/conversion.md walks it: a tiny LLaVA saved by
    transformers (built offline, with its tokenizer and image processor), imported,
    fine-tuned 20 iterations into a new directory (--load A --save B), exported from B,
    and the export's transformers logits equal to the fine-tuned checkpoint's (``compare``
    on B: a checkpoint holding optimizer state)."""
    import transformers
    from megatron_mm.data.digits import prepare_digits
    from megatron_mm.hf.compare import compare
    from megatron_mm.hf.convert import export_hf, import_hf
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    import tiny_models

    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    image_id, vocab = tiny_models.digits_tokenizer(hf_dir)
    model = tiny_models.build("llava_llama", vocab_size=vocab, image_token=image_id)
    model.save_pretrained(hf_dir)
    CLIPImageProcessorPil(size={"shortest_edge": 28},
                          crop_size={"height": 28, "width": 28}).save_pretrained(hf_dir)
    imported, tuned = tmp_path / "imported", tmp_path / "tuned"
    import_hf(str(hf_dir), str(imported))
    prepare_digits(tmp_path / "digits")
    losses, tokenizer_type, log, warned = run_distributed(train, 1, [
        "--load", str(imported), "--save", str(tuned),
        "--data-path", str(tmp_path / "digits"), "--micro-batch-size", "2",
        "--train-iters", "20", "--lr", "1e-3", "--log-interval", "10", "--eval-iters", "2",
        "--eval-interval", "1000", "--log-validation-samples", "4",
        "--tensorboard-dir", str(tmp_path / "tb")])[0]
    assert tokenizer_type == "HuggingFaceTokenizer" and list(losses) == list(range(1, 21))
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert f" > loaded checkpoint from {imported} at iteration 0" in log, log
    # torch's notices about Megatron-Core's checkpoint calls, silenced where they arise
    assert not [w for w in warned if "torch.distributed is disabled" in w
                or "deprecating ShardedTensor" in w or "argument order of load" in w], warned
    _check_shown_answers(log, tmp_path)
    # The trained iteration exports from the new directory (its hf/ carried there)
    out = export_hf(str(tuned), str(tmp_path / "exported"))
    trained = transformers.LlavaForConditionalGeneration.from_pretrained(out)
    assert trained.config.to_dict()["text_config"]["vocab_size"] == vocab
    before, after = model.state_dict(), trained.state_dict()
    assert not torch.equal(before["lm_head.weight"], after["lm_head.weight"])
    # and transformers runs the export as our model runs the fine-tuned checkpoint
    tokens, pixels = tiny_models.inputs("llava_llama", seed=3)
    tokens = tokens % image_id  # ids of this vocabulary, none the placeholder ...
    tokens[:, 1:1 + tiny_models.image_tokens("llava_llama")] = image_id  # but these
    diff, shape = compare(out, str(tuned), {"input_ids": tokens, "pixel_values": pixels})
    assert list(shape) == [2, tokens.shape[1], vocab] and diff < 1e-4, diff


def _check_shown_answers(log, tmp_path):
    """--log-validation-samples 4 (of the evaluation's 4 samples): each validation record
    with its reference answer, and the answers shown agree with the accuracy printed."""
    import re

    from megatron_mm.training.loop.evaluation import normalize_answer
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith(" validation samples at iteration 20"))
    shown = [re.fullmatch(r"   \[(.+?)\] '(.*)' -> '(.*)' \(reference '(.*)'\)", line)
             for line in lines[start + 1:start + 5]]
    assert all(shown), lines[start:start + 5]
    valid = [json.loads(line) for line in
             (tmp_path / "digits" / "valid.jsonl").read_text().splitlines()[:4]]
    want = {r["id"]: r["conversations"][-1]["value"] for r in valid}
    assert {m[1]: m[4] for m in shown} == want
    assert all(m[2].startswith("USER: <image> ") and m[2].endswith("? ASSISTANT:")
               for m in shown), [m[2] for m in shown]  # each question with its image
    accuracy = float(re.search(r"val answer accuracy: ([0-9.]+) \(4 samples\)", log)[1])
    right = sum(normalize_answer(m[3]) == normalize_answer(m[4]) for m in shown)
    assert accuracy == right / 4
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = events.Tensors("validation samples/text_summary")
    assert text.step == 20 and all(m[1] in text.tensor_proto.string_val[0].decode()
                                   for m in shown)
