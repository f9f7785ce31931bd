"""Vision + audio in one model: TP=2, PP=2 (a cut inside the audio encoder) and both
encoders as their own pipelines in the LLM's bubbles (``--encoder-schedule bubble``, also
with a frozen ViT beside the trainable audio encoder, and both encoders at TP 1 inside TP 2)
equal the one-process reference from
the same initial checkpoint (saved at TP=1, loaded at TP=2 and PP=2: checkpoints carry both
encoders). A frozen audio encoder: tests/models."""

import pytest
import torch
from audio_data import AUDIO_MODEL
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

STEPS = 3
# chain: llm embed, vision embed, 2 vision layers, vision projector, audio embed,
# 2 audio layers, audio projector, 2 LLM layers, output = 12; 7,5 cuts between the audio
# layers, so the audio hidden state travels with the text embeddings.
SPLIT_AUDIO = ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "7,5"]


PP2 = ["--pipeline-model-parallel-size", "2"]
BUBBLE = ["--encoder-schedule", "bubble"]
AUTO = ["--encoder-schedule", "auto"]  # the planner's choice for both encoders together
ETP1 = ["--encoder-tensor-model-parallel-size", "1"]


def watch_encoders(chunks, optimizer, holder):
    """Count the audio and vision layers' forward / backward calls on this rank."""
    def bump(counts, key):
        def hook(*_):
            counts[key] += 1
        return hook

    for encoder in ("audio", "vision"):
        counts = holder[f"{encoder}_calls"] = {"fwd": 0, "bwd": 0, "layers": 0}
        for chunk in chunks:
            module = getattr(chunk, f"{encoder}_model", None)
            for layer in (module.decoder.layers if module is not None and module.decoder
                          else ()):
                counts["layers"] += 1
                layer.register_forward_hook(bump(counts, "fwd"))
                layer.register_full_backward_hook(bump(counts, "bwd"))


_REFERENCES = {}


def _reference(audio_digits_dir, tmp_path_factory, model):
    """Initial checkpoint + one-process run for a model variant, shared by the layouts."""
    if tuple(model) not in _REFERENCES:
        init = tmp_path_factory.mktemp("audio_init")
        common = TINY_MODEL + AUDIO_MODEL + model + [
            "--data-path", audio_digits_dir, "--micro-batch-size", "2",
            "--global-batch-size", "8"]
        run_distributed(train, 1, common + ["--train-iters", "0", "--save", str(init)])
        argv = common + ["--train-iters", str(STEPS), "--load", str(init), "--no-load-optim"]
        _REFERENCES[tuple(model)] = argv, run_distributed(train, 1, argv, (1, STEPS))[0]
    return _REFERENCES[tuple(model)]


def _merge(ranks, key, step=None):
    merged = {}
    for out in ranks:
        merged.update(out[key] if step is None else out[key][step])
    return merged


def _assert_equal_runs(stages, ref):
    for it in range(1, STEPS + 1):
        assert stages[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for what, step, atol in (("grads", 1, 1e-6), ("grads", STEPS, 1e-6), ("params", None, 1e-5)):
        ours, theirs = _merge(stages, what, step), (ref[what] if step is None
                                                    else ref[what][step])
        assert ours.keys() == theirs.keys()
        assert any(n.startswith("audio_model.decoder") for n in theirs)
        for name, value in theirs.items():
            torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=atol,
                                       msg=lambda m: f"{what} {step} {name}: {m}")


@pytest.mark.parametrize("world, layout, model", [
    (2, ["--tensor-model-parallel-size", "2"], []),
    (2, SPLIT_AUDIO, []),
    # each encoder cut in two pieces over the two ranks, both feeding LLM chunk 0
    (2, PP2 + BUBBLE, []),
    (2, PP2 + BUBBLE, ["--freeze-ViT"]),
    # both encoders at TP 1 inside TP 2: two replicas, each for half the micro-batches
    (4, ["--tensor-model-parallel-size", "2"] + PP2 + BUBBLE + ETP1, []),
    (2, PP2 + AUTO, []),
], ids=["tp2", "pp2-split-audio", "pp2-bubble", "pp2-bubble-frozen-vit",
        "tp2-pp2-bubble-etp1", "pp2-auto"])
def test_two_encoders_parallel_equals_one_process(audio_digits_dir, tmp_path_factory, world,
                                                  layout, model):
    argv, ref = _reference(audio_digits_dir, tmp_path_factory, model)
    ranks = run_distributed(train, world, argv + layout, (1, STEPS), watch_encoders)
    pp = 2 if "--pipeline-model-parallel-size" in layout else 1
    stages = ranks[::world // pp]  # TP rank 0 of each stage: full (TP-gathered) tensors
    _assert_equal_runs(stages, ref)
    for encoder in ("audio", "vision"):
        calls = [out["observed"][f"{encoder}_calls"] for out in stages]
        assert sum(c["layers"] for c in calls) == 2
        if ("--pipeline-model-parallel-size" in layout and AUTO[1] not in layout
                and (encoder == "audio" or BUBBLE[1] in layout)):
            assert [c["layers"] for c in calls] == [1, 1]  # the cut is inside the encoder
        frozen = encoder == "vision" and "--freeze-ViT" in model
        for c in calls:
            if c["layers"]:  # frozen: autograd never enters it
                assert c["fwd"] > 0 and (c["bwd"] == 0) == frozen, (encoder, calls)
        if ETP1[0] in layout:  # each replica: its layer for 2 of 4 micro-batches per step
            assert all(out["observed"][f"{encoder}_calls"]["fwd"] == 2 * STEPS
                       for out in ranks), (encoder, ranks)
