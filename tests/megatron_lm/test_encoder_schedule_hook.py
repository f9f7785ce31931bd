"""``use_encoder_schedule``: Megatron-LM's ``get_forward_backward_func`` (the name its
``train_step`` and ``evaluate`` take their schedule from) runs the bubble schedule, called
with the keywords they pass, the last stage handed ``None`` iterators as Megatron-LM
hands its middle stages; the run equals one process from the same checkpoint. Each
keyword the schedules cannot honour is refused with its own error."""

import pytest
import torch
from dist_harness import run_distributed
from equivalence import REFERENCE_STEPS as STEPS
from equivalence import merge_stages
from encoder_schedule_runs import train_through_megatron_lm

pytestmark = pytest.mark.processes

# the ViT whole on rank 0, in two pieces among the LLM's work; rank 1 reads no data
BUBBLE = ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble",
          "--encoder-pipeline-model-parallel-size", "1", "--encoder-pieces", "2"]


def test_megatron_lm_forward_backward_func_runs_the_bubble_schedule(one_process_reference,
                                                                    digits_dir):
    argv, ref = one_process_reference(digits_dir, [])
    ranks = run_distributed(train_through_megatron_lm, 2, argv + BUBBLE + ["--eval-interval", "2"],
                            (1, STEPS), (1,))
    last = ranks[-1]
    for it in range(1, STEPS + 1):
        assert last["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for what, step in (("grads", 1), ("grads", STEPS), ("params", None)):
        ours = merge_stages(ranks, what, step)
        theirs = ref[what] if step is None else ref[what][step]
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            if value is not None:
                torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=1e-5,
                                           msg=lambda m: f"{what} {step} {name}: {m}")
    for out in ranks:
        hook = out["hook"]
        assert hook["train_calls"] == STEPS and hook["eval_calls"] >= 1, hook
        # evaluate's call gives what the package's own call gives, bit for bit
        assert hook["eval_same"], hook
        # honoured: handed on to Megatron-Core's finalize_model_grads
        assert hook["finalize"] == {"pg_collection": True, "force_all_reduce": True}, hook
        assert out["restored"]
        errors = out["refusals"]
        for name, words in [("decoder_seq_length", "decoder-only"),
                            ("adjust_tensor_shapes_fn", "ModelOpt"),
                            ("pg_collection", "pg_collection.pp"),
                            ("p2p_communicator", "p2p_communicator.pp_group"),
                            ("multi_module", "MultiModuleProcessGroupCollection"),
                            ("pp_size", "pp_size=3"), ("twice", "twice")]:
            assert errors[name] is not None and words in errors[name], (name, errors[name])
    # rank 0 runs the ViT's pieces: without an iterator it is refused before any message
    assert "no data iterator" in ranks[0]["refusals"]["no_data"]
    assert "EF(" in ranks[0]["refusals"]["no_data"], ranks[0]["refusals"]["no_data"]
