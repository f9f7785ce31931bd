"""``--encoder-schedule separate`` through the training script: the encoders on ranks of
their own next to the LLM's pipeline (``training/separate_run.py``), loading the colocated
initial checkpoint, equal one process (losses, gradients of the first and last step,
parameters) with a trainable and a frozen ViT, with vision + audio sharing two encoder
ranks or each on ranks of its own (a frozen ViT on one, the audio encoder on two, the LLM
on one), with one encoder rank serving two LLM replicas, and as ``--encoder-schedule
auto``'s pick; its checkpoint loads colocated (the colocated keys), also at encoder TP 2
(the continued step equal one process's); with 1 encoder rank its validation (forward
only) equals one process too; the greedy decoding of the val answer accuracy equals the
colocated run's in every case (and one process's at LLM TP 2 + SP and CP 2)."""

import math

import pytest
import torch
from audio_data import AUDIO_MODEL
from dist_harness import run_distributed
from equivalence import REFERENCE_STEPS as STEPS
from equivalence import (assert_equal_runs, assert_norm_counted_once, assert_same_answers,
                         merge_stages)
from train_workers import record_answers, train

pytestmark = pytest.mark.processes

SEPARATE = ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "separate"]
# each encoder on ranks of its own (vision: rank 0, audio: ranks 1-2), the LLM on rank 3
OWN = ["--pipeline-model-parallel-size", "1", "--encoder-schedule", "separate",
       "--vision-encoder-data-parallel-size", "1", "--audio-encoder-data-parallel-size", "2"]
EVALUATE = ["--eval-interval", "1", "--eval-max-new-tokens", "0"]
ANSWER = ["--eval-max-new-tokens", "2"]  # the val answer accuracy, by greedy decoding


@pytest.mark.parametrize("encoder_ranks, llm_dp, model, auto", [
    (1, 1, [], False), (1, 1, ["--freeze-ViT"], False),
    # two encoders (vision + audio) sharing both encoder replicas
    (2, 1, AUDIO_MODEL, False),
    # each on replicas of its own: a frozen ViT's rank next to the trained audio encoder's
    # two (its own data-parallel group)
    ({"vision": 1, "audio": 2}, 1, AUDIO_MODEL + ["--freeze-ViT"], False),
    # one encoder rank serving two LLM replicas (encoder DP unlike LLM DP)
    (1, 2, [], False),
    # --encoder-schedule auto on 2 ranks at PP 2 picks 1 encoder rank + the LLM at PP 1
    # (a frozen ViT as heavy as the LLM, by its layer profile)
    (1, 1, ["--freeze-ViT"], True)],
    ids=["1-encoder-rank", "1-encoder-rank-frozen-vit", "2-encoder-ranks-vision-audio",
         "own-encoder-ranks-vision-audio", "1-encoder-rank-llm-dp2", "auto-separate"])
def test_separate_placement_equals_one_process(one_process_reference, digits_dir,
                                               audio_digits_dir, tmp_path_factory,
                                               encoder_ranks, llm_dp, model, auto):
    data = audio_digits_dir if AUDIO_MODEL[0] in model else digits_dir
    # the first case evaluates too (the loss only), as the reference does after steps 1
    # and 2, and at the end, as the colocated run loading its checkpoint does
    evaluate = EVALUATE if encoder_ranks == 1 and llm_dp == 1 and not model else []
    # ... and every case's greedy answers at the end the colocated run's (two LLM
    # replicas, a frozen ViT, vision + audio on shared or their own encoder ranks)
    answers = not auto
    argv, ref = one_process_reference(data, model + evaluate)
    run_argv = [a for a in argv if not (answers and a == "--skip-final-eval")]
    run_argv += ANSWER if answers else []
    own = isinstance(encoder_ranks, dict)
    saved = tmp_path_factory.mktemp("separate")
    if auto:
        from plans import separate_profile

        layout = SEPARATE[:2] + ["--encoder-schedule", "auto"]
        layout += ["--pipeline-profile", separate_profile(argv + layout, 2,
                                                          saved / "profile.json", 20, 10)]
        pp = 1
    else:
        layout = OWN if own else SEPARATE + ["--encoder-data-parallel-size",
                                             str(encoder_ranks)]
        pp = 1 if own else 2
    encoder_ranks = sum(encoder_ranks.values()) if own else encoder_ranks
    ranks = run_distributed(train, encoder_ranks + pp * llm_dp,
                            run_argv + layout + ["--save", str(saved)], (1, STEPS),
                            record_answers if answers else None)
    # the LLM's ranks in Megatron-Core's order: replica d's stage r at d + llm_dp * r
    encoders, stages = ranks[:encoder_ranks], ranks[encoder_ranks::llm_dp]
    # the loss lives on the LLM's last stage
    assert all(math.isnan(loss) for out in encoders for loss in out["losses"].values())
    modules = [{n.split(".")[0] for n in out["params"]} for out in encoders]
    if own:  # each rank builds only its encoder; the audio replicas hold the same state
        assert modules == [{"vision_model"}, {"audio_model"}, {"audio_model"}]
        for what in ("params", "grads"):
            theirs = encoders[2][what] if what == "params" else encoders[2][what][STEPS]
            for name, value in (encoders[1][what] if what == "params"
                                else encoders[1][what][STEPS]).items():
                assert torch.equal(value, theirs[name]), (what, name)
        encoders = encoders[:2]
    else:
        for out in encoders[1:]:  # encoder replicas hold the same reduced state
            assert out["params"].keys() == encoders[0]["params"].keys()
        assert modules[0] == ({"vision_model", "audio_model"} if AUDIO_MODEL[0] in model
                              else {"vision_model"})
        encoders = encoders[:1]
    assert_equal_runs(encoders + stages, ref, STEPS, holding="vision_model.")
    assert_norm_counted_once(ranks, ref, STEPS)
    if auto:
        return
    # its checkpoint (model and optimizer) loads colocated on the LLM's layout (PP=2 on 2
    # ranks, the encoder on the first stage): the same weights
    at = run_argv.index("--load")
    argv = run_argv[:at] + ["--load", str(saved)] + [a for a in run_argv[at + 2:]
                                                     if a != "--no-load-optim"]
    loaded = run_distributed(train, 2, argv + SEPARATE[:2], (), record_answers)
    assert all(out["iteration"] == STEPS for out in loaded)
    if evaluate:  # the validation losses, on the LLM's last stage only
        assert stages[-1]["val_losses"] == pytest.approx(
            {**ref["val_losses"], STEPS: loaded[-1]["val_loss"]}, rel=1e-5)
        assert all(math.isnan(out["val_loss"]) for out in encoders + stages[:-1])
    if answers:  # the last evaluation's greedy decoding: the colocated run's, each
        # replica its share (the encoder rank encoded every replica's prompts once)
        assert_same_answers(ranks[-llm_dp:], loaded[-1], 8)
        assert all(math.isnan(out["val_accuracy"]) for out in encoders)
    ours = merge_stages(encoders + stages, "params")
    theirs = merge_stages(loaded, "params")
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name


@pytest.mark.parametrize("world, encoder_ranks, layout", [
    # two encoder replicas: each holds a shard of the distributed optimizer's state
    (4, 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--encoder-data-parallel-size", "2", "--use-distributed-optimizer",
            "--overlap-grad-reduce"]),
    (4, 2, ["--context-parallel-size", "2", "--context-parallel-block", "8",
            "--context-parallel-assignment", "zigzag",
            "--encoder-tensor-model-parallel-size", "2"])],
    ids=["llm-tp2-sp-distributed-optimizer", "llm-cp2-encoder-tp2"])
def test_separate_placement_with_tensor_and_context_parallelism_equals_one_process(
        one_process_reference, digits_dir, tmp_path, world, encoder_ranks, layout):
    """LLM PP 1: every TP (and CP) rank of the LLM takes the encoder output, the gradient
    goes back from one (summed over the CP ranks); the encoder replica's TP ranks each
    take it, in validation too, and greedy decoding (each TP / CP rank decodes whole
    prompts) answers as one process loading the run's checkpoint does. The gradient norm
    counts every parameter once (the distributed optimizer's shards on both sides, the
    encoder's TP ranks)."""
    argv, ref = one_process_reference(digits_dir, EVALUATE)  # evaluating after steps 1, 2
    # ... and at the end, decoding too
    run_argv = [a for a in argv if a != "--skip-final-eval"] + ANSWER
    ranks = run_distributed(train, world, run_argv + ["--encoder-schedule", "separate"] + layout
                            + ["--save", str(tmp_path)], (1, STEPS), record_answers)
    at = run_argv.index("--load")
    one = run_distributed(train, 1, run_argv[:at] + ["--load", str(tmp_path)]
                          + run_argv[at + 2:], (), record_answers)[0]
    assert one["iteration"] == STEPS
    assert ranks[-1]["val_losses"] == pytest.approx({**ref["val_losses"], STEPS: one["val_loss"]},
                                                    rel=1e-5)
    assert_same_answers(ranks[-1:], one, 8, atol=1e-5)
    # the encoder replica's first rank and the LLM's first TP / CP rank, gathered to TP 1
    stages = [ranks[0], ranks[encoder_ranks]]
    if "--encoder-data-parallel-size" in layout:
        # the distributed optimizer leaves an encoder replica the reduced gradients of its
        # own shard only: the encoder's are checked through the norm and the parameters
        stages[0] = dict(stages[0], grads={step: {} for step in stages[0]["grads"]})
        ref = dict(ref, grads={step: {n: g for n, g in grads.items()
                                      if not n.startswith("vision_model.")}
                               for step, grads in ref["grads"].items()})
    assert any(n.startswith("vision_model.") for n in stages[0]["params"])
    # CP sums the attention in another order: Adam moves a near-zero gradient's weight by
    # up to lr (1e-3) on a last-bit difference
    assert_equal_runs(stages, ref, STEPS,
                      params_atol=1e-4 if "--context-parallel-size" in layout else 1e-5)
    for step in range(1, STEPS + 1):
        assert ranks[-1]["grad_norms"][step] == pytest.approx(ref["grad_norms"][step],
                                                              rel=2e-5), step


def test_checkpoint_of_encoder_tp2_loads_colocated_and_continues(
        one_process_reference, digits_dir, tmp_path):
    """The encoder's TP 2 shards (2 encoder ranks, the LLM on the third) save under the
    colocated keys: a one-process run loads the separate run's checkpoint of step 2,
    model and optimizer, and its third step is the one-process reference's (loss and
    parameters)."""
    argv, ref = one_process_reference(digits_dir)
    at = argv.index("--load")
    common = argv[:at] + [a for a in argv[at + 2:] if a != "--no-load-optim"]
    steps = argv.index("--train-iters") + 1
    first = argv[:steps] + [str(STEPS - 1)] + argv[steps + 1:]
    ranks = run_distributed(train, 3, first + ["--encoder-schedule", "separate",
                                               "--encoder-tensor-model-parallel-size", "2",
                                               "--save", str(tmp_path)])
    assert ranks[-1]["losses"] == pytest.approx(
        {s: ref["losses"][s] for s in range(1, STEPS)}, rel=1e-5)
    loaded = run_distributed(train, 1, common + ["--load", str(tmp_path)])[0]
    assert list(loaded["losses"]) == [STEPS]
    assert loaded["losses"][STEPS] == pytest.approx(ref["losses"][STEPS], rel=1e-5)
    assert loaded["params"].keys() == ref["params"].keys()
    for name, value in ref["params"].items():
        torch.testing.assert_close(loaded["params"][name], value, rtol=0, atol=1e-5,
                                   msg=name)
