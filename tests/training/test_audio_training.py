"""Vision + audio in one model: TP=2 and PP=2 (a cut inside the audio encoder) equal the
one-process reference from the same initial checkpoint (saved at TP=1, loaded at TP=2 and
PP=2: checkpoints carry both encoders). A frozen audio encoder: tests/models."""

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


def watch_audio(chunks, optimizer, holder):
    """Snapshot the audio weights; count audio-layer forward / backward calls."""
    counts = holder["audio_calls"] = {"fwd": 0, "bwd": 0, "layers": 0}
    holder["audio_init"] = {n: p.detach().clone() for c in chunks
                            for n, p in c.named_parameters() if n.startswith("audio_model.")}

    def bump(key):
        def hook(*_):
            counts[key] += 1
        return hook

    for chunk in chunks:
        audio = getattr(chunk, "audio_model", None)
        for layer in (audio.decoder.layers if audio is not None and audio.decoder else ()):
            counts["layers"] += 1
            layer.register_forward_hook(bump("fwd"))
            layer.register_full_backward_hook(bump("bwd"))


@pytest.fixture(scope="module")
def init_and_reference(audio_digits_dir, tmp_path_factory):
    init = tmp_path_factory.mktemp("audio_init")
    common = TINY_MODEL + AUDIO_MODEL + ["--data-path", audio_digits_dir,
                                         "--micro-batch-size", "2", "--global-batch-size", "8"]
    run_distributed(train, 1, common + ["--train-iters", "0", "--save", str(init)])
    argv = common + ["--train-iters", str(STEPS), "--load", str(init), "--no-load-optim"]
    return argv, run_distributed(train, 1, argv, (1, STEPS), watch_audio)[0]


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


@pytest.mark.parametrize("world, layout", [
    (2, ["--tensor-model-parallel-size", "2"]),
    (2, SPLIT_AUDIO),
], ids=["tp2", "pp2-split-audio"])
def test_two_encoders_parallel_equals_one_process(init_and_reference, world, layout):
    argv, ref = init_and_reference
    ranks = run_distributed(train, world, argv + layout, (1, STEPS), watch_audio)
    stages = ranks if "--pipeline-model-parallel-size" in layout else ranks[:1]
    _assert_equal_runs(stages, ref)
    calls = [out["observed"]["audio_calls"] for out in stages]
    assert sum(c["layers"] for c in calls) == 2
    if "--pipeline-model-parallel-size" in layout:
        assert [c["layers"] for c in calls] == [1, 1]  # the cut is inside the encoder
    assert all(c["bwd"] > 0 for c in calls if c["layers"]), calls

