"""Vision + audio in one model: TP=2, PP=2 (a cut inside the audio encoder) and both
encoders as their own pipelines in the LLM's bubbles (``--encoder-schedule bubble``, also
with a frozen ViT beside the trainable audio encoder, and both encoders at TP 1 inside TP 2)
equal the one-process reference from
the same initial checkpoint (saved at TP=1, loaded at TP=2 and PP=2: checkpoints carry both
encoders). A frozen audio encoder: tests/models."""

import pytest
from audio_data import AUDIO_MODEL
from dist_harness import run_distributed
from equivalence import REFERENCE_STEPS as STEPS
from equivalence import assert_equal_runs
from train_workers import train

pytestmark = pytest.mark.processes

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
def test_two_encoders_parallel_equals_one_process(one_process_reference, audio_digits_dir,
                                                  world, layout, model):
    argv, ref = one_process_reference(audio_digits_dir, AUDIO_MODEL + model)
    ranks = run_distributed(train, world, argv + layout, (1, STEPS), watch_encoders)
    pp = 2 if "--pipeline-model-parallel-size" in layout else 1
    stages = ranks[::world // pp]  # TP rank 0 of each stage: full (TP-gathered) tensors
    assert_equal_runs(stages, ref, STEPS, holding="audio_model.decoder")
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
