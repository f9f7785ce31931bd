"""Training with RoPE scaling by Megatron-LM's flags: YaRN (``--position-embedding-type
yarn``) and Llama 3.x's scaling (``--use-rope-scaling``) at CP=2 equal one process from the
same initial checkpoint (losses, gradients, parameters). Under CP each rank rotates its
tokens at their global positions (MultimodalModel's hook on the rotary embedding), which
for YaRN returns its angles with its cos / sin scale."""

import pytest
from dist_harness import run_distributed
from equivalence import REFERENCE_STEPS as STEPS
from equivalence import assert_equal_runs
from train_workers import train

pytestmark = pytest.mark.processes

# YaRN's original context (16) shorter than the samples (about 30-40 tokens)
YARN = ["--position-embedding-type", "yarn", "--rotary-scaling-factor", "4",
        "--yarn-original-max-position-embeddings", "16"]
LLAMA3 = ["--use-rope-scaling", "--rope-scaling-factor", "8", "--rotary-base", "500000"]
CP2 = ["--context-parallel-size", "2", "--context-parallel-block", "8"]


def _watch_rope(model, optimizer, holder):
    """The LLM's rotary embedding, YaRN's cos / sin scale in its attention, and whether
    each micro-batch was split over the CP ranks."""
    from megatron_mm.models.context_parallel import ContextParallelMask

    llm = model[0].language_model
    holder["rotary"] = type(llm.rotary_pos_emb).__name__
    holder["scale"] = llm.decoder.layers[0].self_attention._yarn_concentration_factor
    split = holder.setdefault("split", [])

    def hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        split.append(isinstance(mask, ContextParallelMask) and not mask.replicated)
    model[0].register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("model, rotary, scale", [
    (YARN, "YarnRotaryEmbedding", 0.1 * 1.3862943611198906 + 1),  # 0.1 ln 4 + 1
    (LLAMA3, "RotaryEmbedding", 1.0),
], ids=["yarn", "llama3"])
def test_rope_scaling_context_parallel_equals_one_process(one_process_reference, digits_dir,
                                                          model, rotary, scale):
    argv, ref = one_process_reference(digits_dir, model)
    ranks = run_distributed(train, 2, argv + CP2, (1, STEPS), _watch_rope)
    observed = ranks[0]["observed"]
    assert observed["rotary"] == rotary
    assert observed["scale"] == pytest.approx(scale)
    assert any(observed["split"]), observed["split"]
    assert_equal_runs(ranks[:1], ref, STEPS)
