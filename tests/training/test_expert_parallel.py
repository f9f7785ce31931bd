"""Expert parallelism equals one process: EP=2, TP=2 x EP=2, PP=2 x EP=2, PP=2 x VPP=2
x EP=2, CP=2 x EP=2 and the bubble and coarse schedules at PP=2 x EP=2 runs of an MoE LLM
with a dense layer among the sparse ones (losses, gradients, parameters, the load-balancing
loss and the tokens per expert, in the summary and in TensorBoard), all starting from one
saved init (the checkpoint reshards the experts)."""

import pytest
from dist_harness import run_distributed
from equivalence import REFERENCE_STEPS as STEPS
from equivalence import assert_equal_runs, assert_norm_counted_once, assert_same_moe_losses
from train_workers import train

pytestmark = pytest.mark.processes

# Three LLM layers: MoE, dense, MoE (four experts, top-2, the aux loss on); the all-to-all
# dispatcher (pipeline parallelism needs it) on gloo.
MOE_MODEL = ["--num-layers", "3", "--num-experts", "4", "--moe-ffn-hidden-size", "32",
             "--moe-layer-freq", "[1,0,1]", "--moe-router-topk", "2",
             "--moe-aux-loss-coeff", "0.01", "--moe-token-dispatcher-type", "alltoall"]
EP2 = ["--expert-model-parallel-size", "2"]


@pytest.mark.parametrize("world, layout", [
    (2, EP2),
    (2, EP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel",
               "--expert-tensor-parallel-size", "1"]),
    (4, EP2 + ["--pipeline-model-parallel-size", "2"]),
    (4, EP2 + ["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size",
               "2", "--pipeline-partition", "auto"]),
    # CP ranks split each sequence (blocks of 16), or, shorter than two blocks of 128,
    # each holds it whole
    (2, EP2 + ["--context-parallel-size", "2", "--context-parallel-block", "16"]),
    (2, EP2 + ["--context-parallel-size", "2"]),
    # the schedule executor: the ViT as its own pipeline in the LLM's bubbles, the experts'
    # all-to-alls inside the LLM actions (actions of the plan)
    (4, EP2 + ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble"]),
    (4, EP2 + ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "coarse"]),
], ids=["ep2", "tp2-ep2", "pp2-ep2", "pp2-vpp2-ep2", "cp2-ep2", "cp2-whole-ep2",
        "pp2-ep2-bubble", "pp2-ep2-coarse"])
def test_expert_parallel_equals_one_process(one_process_reference, digits_dir, tmp_path,
                                            world, layout):
    argv, ref = one_process_reference(digits_dir, MOE_MODEL)
    tb = str(tmp_path / "tb")
    ranks = run_distributed(train, world, argv + layout + ["--tensorboard-dir", tb],
                            (1, STEPS))
    pp = 2 if "--pipeline-model-parallel-size" in layout else 1
    stages = ranks[:: world // pp]  # TP rank 0 of each stage: full (TP-gathered) tensors
    assert_equal_runs(stages, ref, STEPS, holding="language_model.decoder.layers.2.mlp."
                      "experts.local_experts.3")
    # the MoE losses on every rank and in TensorBoard
    assert_same_moe_losses(ranks, ref, STEPS, tensorboard_scalars(tb))


def test_separate_placement_with_expert_parallelism_equals_one_process(
        one_process_reference, digits_dir, tmp_path):
    """``--encoder-schedule separate``: the ViT on rank 0, the MoE LLM's two replicas on
    ranks 1-2 at EP=2 (Megatron-Core's expert groups over the LLM's ranks only): losses,
    gradients (every parameter counted once in the norm, each EP rank's experts too),
    parameters, the load-balancing loss and the tokens per expert on the LLM's ranks and
    in TensorBoard (written by the last rank, an LLM rank)."""
    argv, ref = one_process_reference(digits_dir, MOE_MODEL)
    tb = str(tmp_path / "tb")
    ranks = run_distributed(train, 3, argv + EP2 + [
        "--encoder-schedule", "separate", "--tensorboard-dir", tb], (1, STEPS),
        expert_group_ranks)
    assert [out["observed"]["expert_group"] for out in ranks] == [[0], [1, 2], [1, 2]]
    encoder, llm = ranks[0], ranks[1:]
    assert {n.split(".")[0] for n in encoder["params"]} == {"vision_model"}
    assert_equal_runs([encoder, llm[0]], ref, STEPS, holding="language_model.decoder."
                      "layers.2.mlp.experts.local_experts.3")
    assert_norm_counted_once(ranks, ref, STEPS)
    for it in range(1, STEPS + 1):  # the norm clipping uses, reduced over the world
        assert ranks[-1]["grad_norms"][it] == pytest.approx(ref["grad_norms"][it],
                                                            rel=2e-5), it
    assert all(ref["moe_losses"][it]["load_balancing_loss"] > 0 for it in range(1, STEPS + 1))
    assert_same_moe_losses(llm, ref, STEPS, tensorboard_scalars(tb))


def expert_group_ranks(model, optimizer, holder) -> None:
    """The global ranks of this rank's expert-model-parallel group."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    holder["expert_group"] = dist.get_process_group_ranks(
        parallel_state.get_expert_model_parallel_group())


def tensorboard_scalars(directory) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(directory, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)}
            for tag in events.Tags()["scalars"]}


def test_validation_with_expert_parallelism(one_process_reference, digits_dir):
    """The final validation (loss and greedy answers) at EP=2 equals one process's: every
    rank decodes every prompt in lockstep, as the experts' all-to-alls pair the ranks'
    forwards (decoding each rank's own share, they would wait on each other forever); so
    does the separate placement's."""
    argv, _ = one_process_reference(digits_dir, MOE_MODEL)
    argv = [a for a in argv if a != "--skip-final-eval"] + ["--train-iters", "1"]
    one = run_distributed(train, 1, argv)[0]
    ranks = run_distributed(train, 2, argv + EP2)
    # the separate placement: the ViT on rank 0 encodes every prompt for both LLM replicas,
    # which decode them all in lockstep
    separate = run_distributed(train, 3, argv + EP2 + ["--encoder-schedule", "separate"])
    for rank in ranks + separate[1:]:
        assert rank["val_loss"] == pytest.approx(one["val_loss"], rel=1e-5)
        assert rank["val_accuracy"] == one["val_accuracy"]
