"""An MoE LLM's expert all-to-alls are actions of the plan: placed right after the LLM
actions that run them, validated, simulated (the action's outputs leave after them), in
the replicas' rendezvous check; the cost model charges active-parameter FLOPs and the
all-to-all volume, and the partition search, the training chain's action costs and the
Optimus planner use them."""

import dataclasses

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.costs import flops
from megatron_mm.plan.costs.hardware import Hardware, Interconnect
from megatron_mm.plan.model import ModelSpec, TransformerSpec, Workload
from megatron_mm.plan.pipeline.chain import build_chain
from megatron_mm.plan.pipeline.partition import partition
from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.action_costs import CostModel, LLMLayout
from megatron_mm.plan.schedules.actions import Kind, validate
from megatron_mm.plan.schedules.bubble import bubble
from megatron_mm.plan.schedules.collectives import add_expert_all_to_alls
from megatron_mm.plan.schedules.generate import coarse, megatron
from megatron_mm.plan.schedules.p2p import check_replicas, p2p_program
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate

# A Qwen3-MoE-like LLM: 128 experts of 768, top-8; 4 layers, the first dense (intermediate
# 6144, Hugging Face's mlp_only_layers=[0]).
MOE = TransformerSpec(hidden_size=2048, num_layers=4, ffn_hidden_size=6144,
                      num_attention_heads=32, num_query_groups=4, kv_channels=128,
                      gated_linear_unit=True, num_experts=128, moe_router_topk=8,
                      moe_ffn_hidden_size=768, moe_layer_freq=[0, 1, 1, 1], vocab_size=1000)


def _costs(pp, a2a):
    return ActionCosts([1.0] * pp, [2.0] * pp, [1.0] * pp, [2.0] * pp, p2p_s=0.01,
                       all_to_all_s=[a2a] * pp, backward_all_to_all_s=[2 * a2a] * pp)


@pytest.mark.parametrize("generator", ["megatron", "coarse", "bubble"])
def test_all_to_alls_follow_their_llm_actions_and_are_charged(generator):
    pp, m = 2, 4
    costs = _costs(pp, 0.25)
    make = {"megatron": lambda: megatron(pp, 1, m, grad_sync=True),
            "coarse": lambda: coarse(ScheduleProblem(pp, m, grad_sync=True)),
            "bubble": lambda: bubble(ScheduleProblem(pp, m, costs=costs.all_to_alls_folded(),
                                                     grad_sync=True))}[generator]
    plain = make()
    s = add_expert_all_to_alls(make(), [1])  # MoE layers in chunk 1 only
    for r, order in enumerate(s.ranks):
        keys = [a.key for a in order]
        for i, a in enumerate(order):
            if a.kind.llm:
                follows = keys[i + 1] if i + 1 < len(keys) else None
                want = (Kind.A2A if a.kind == Kind.F else Kind.A2A_B, a.microbatch, 1)
                assert (follows == want) == (a.chunk == 1), (r, a)
    assert sum(a.kind.expert for r in s.ranks for a in r) == 2 * m
    with_a2a, without = simulate(s, costs), simulate(plain, costs)
    # rank 1 runs every all-to-all (3 x 0.25 per micro-batch), in the open: the
    # iteration grows by at least its last micro-batch's, by at most all of them
    assert 0.75 <= with_a2a.iteration_s - without.iteration_s <= m * 0.75 + 1e-9
    timed = {(t.kind, t.microbatch, t.chunk): t for t in with_a2a.timeline}
    for mb in range(m):  # B(m, 0) takes the gradient once B(m, 1)'s all-to-alls are done
        a2a = timed[(Kind.A2A_B, mb, 1)]
        assert a2a.end_s - a2a.start_s == pytest.approx(0.5)
        assert timed[("B", mb, 0)].start_s >= a2a.end_s + 0.01 - 1e-9
        assert timed[("F", mb, 1)].start_s >= timed[("F", mb, 0)].end_s
    assert any(e["name"].startswith("A2A") for e in with_a2a.chrome_trace()["traceEvents"])


def test_an_all_to_all_apart_from_its_llm_action_is_refused():
    s = add_expert_all_to_alls(megatron(2, 1, 2), [0])
    order = s.ranks[0]
    i = next(i for i, a in enumerate(order) if a.kind == Kind.A2A)
    order.insert(i + 2, order.pop(i))  # after the next action instead
    with pytest.raises(PlanError, match="apart from its LLM action"):
        validate(s)
    s = add_expert_all_to_alls(megatron(2, 1, 2), [0])
    s.expert_chunks = []
    with pytest.raises(PlanError, match="A2A / A2A_B a chunk among expert_chunks"):
        validate(s)
    with pytest.raises(PlanError, match="expert chunks \\[5\\] are not among its 2"):
        add_expert_all_to_alls(megatron(2, 1, 2), [5])


def test_encoder_replicas_meet_in_the_all_to_alls():
    """The replicas of a stage (expert-parallel peers too) meet in every A2A: a replica
    that skips one (runs a shorter list) hangs the others, and the check says so."""
    pp, m = 2, 4
    s = add_expert_all_to_alls(bubble(ScheduleProblem(pp, m,
                                                      costs=_costs(pp, 0.1).all_to_alls_folded(),
                                                      encoder_replicas=2)), [0, 1])
    program = p2p_program(s, s.ranks)
    check_replicas(s, s.ranks, program)
    from megatron_mm.plan.schedules.p2p import check_replica_rendezvous, replica_program
    short = [list(r) for r in s.ranks]
    short[1] = [a for a in short[1] if a.key != (Kind.A2A_B, m - 1, 1)]
    programs = [replica_program(program, j, 2) for j in range(2)]
    programs[1] = p2p_program(s, short)
    with pytest.raises(PlanError, match="encoder replicas deadlock"):
        check_replica_rendezvous(s, [replica_program(programs[0], 0, 2),
                                     replica_program(programs[1], 1, 2)],
                                 [s.ranks, short])


def test_moe_layers_charge_active_parameters_and_dense_layers_their_own_mlp():
    tokens = 4096
    dense = flops.transformer_layer(MOE, 1, tokens, True, moe=False)
    sparse = flops.transformer_layer(MOE, 1, tokens, True, moe=True)
    h = MOE.hidden_size
    attn = h * MOE.q_dim + 2 * h * MOE.kv_dim + MOE.q_dim * h
    core = 4.0 * tokens * tokens * MOE.q_dim * 0.5
    assert sparse.fwd == pytest.approx(2.0 * tokens * (attn + 128 * h + 8 * 3 * h * 768) + core)
    assert dense.fwd == pytest.approx(2.0 * tokens * (attn + 3 * h * 6144) + core)
    assert sparse.params == pytest.approx(attn + 128 * h + 128 * 3 * h * 768 + 2 * h)
    shared = dataclasses.replace(MOE, moe_shared_expert_intermediate_size=1024)
    assert flops.transformer_layer(shared, 1, tokens, True, moe=True).fwd - sparse.fwd == \
        pytest.approx(2.0 * tokens * 3 * h * 1024)
    attention, mlp = flops.transformer_sublayers(MOE, 1, tokens, True, moe=True)
    assert attention.fwd + mlp.fwd == pytest.approx(sparse.fwd)
    chain = build_chain(_model(), Workload(seq_length=tokens))
    layers = [l for l in chain if l.kind == "llm_layer"]
    assert layers[0].fwd_flops == pytest.approx(dense.fwd)
    assert [l.fwd_flops for l in layers[1:]] == pytest.approx([sparse.fwd] * 3)


def _model(llm=MOE):
    return ModelSpec(name="moe", encoders=[], llm=llm)


def test_the_all_to_all_volume_is_timed_on_the_links():
    tokens, ep, tp = 4096, 4, 2
    chain = build_chain(_model(), Workload(seq_length=tokens, tensor_model_parallel_size=tp,
                                           expert_model_parallel_size=ep))
    layers = [l for l in chain if l.kind == "llm_layer"]
    one = 2 * tokens * 8 * 2048 * (ep - 1) / ep / tp  # bf16, top-8, off this rank, SP
    assert [l.a2a_bytes for l in layers] == pytest.approx([0, one, one, one])
    assert {l.a2a_span for l in layers[1:]} == {tp * ep}
    links = Interconnect()
    from megatron_mm.plan.costs.unit_costs import TimeModel
    f, b = TimeModel(Hardware(), links).expert_all_to_all_s(layers)
    assert f == pytest.approx(3 * 2 * one / links.tp_bandwidth)  # 8 GPUs: NVLink
    assert b == pytest.approx(f)
    wide = dataclasses.replace(layers[1], a2a_span=16)  # across nodes: RDMA
    assert TimeModel(Hardware(), links).expert_all_to_all_s([wide])[0] == pytest.approx(
        2 * (links.p2p_latency_s + one / links.dp_bandwidth))


def test_the_partition_weighs_the_all_to_alls():
    """Four MoE layers and a dense one: without expert parallelism the min-max cut puts
    the dense layer (its MLP 8x an expert's active share) with one MoE layer; with EP over
    nodes the all-to-alls make the MoE layers heavier and the cut moves."""
    llm = dataclasses.replace(MOE, num_layers=6, moe_layer_freq=[1, 1, 1, 1, 0, 0],
                              ffn_hidden_size=24576)
    cut = {}
    for ep in (1, 16):
        chain = build_chain(_model(llm), Workload(seq_length=4096,
                                                  expert_model_parallel_size=ep))
        cut[ep] = partition(chain, 2, 1, "auto").layers_per_chunk
    assert cut[1] != cut[16], cut
    assert cut[16][0] < cut[1][0]  # fewer MoE layers on the first stage


def test_the_cluster_cost_model_charges_the_all_to_alls_and_splits_the_experts():
    llm = dataclasses.replace(MOE, moe_layer_freq=[])
    from megatron_mm.plan.model import EncoderSpec
    vit = EncoderSpec(name="vision", modality="vision",
                      transformer=TransformerSpec(hidden_size=1152, num_layers=4,
                                                  ffn_hidden_size=4304,
                                                  num_attention_heads=16),
                      tokens_per_item=1024, llm_tokens_per_item=256)
    model = ModelSpec(name="vlm", encoders=[vit], llm=llm)
    lay = dict(pipeline_model_parallel_size=2, tensor_model_parallel_size=2,
               data_parallel_size=4, global_batch_size=16, seq_length=4096)
    one = CostModel(model, LLMLayout(**lay), Hardware(), Interconnect())
    four = CostModel(model, LLMLayout(**lay, expert_model_parallel_size=4), Hardware(),
                     Interconnect())
    assert one.llm_all_to_alls() == ([], [])
    fwd, bwd = four.llm_all_to_alls()
    assert len(fwd) == 2 and min(fwd) > 0 and bwd == pytest.approx([2 * f for f in fwd])
    assert four.baseline().all_to_all_s == fwd
    assert four.llm_params_per_gpu() < one.llm_params_per_gpu() / 2  # experts split by 4
    m = LLMLayout(**lay).num_microbatches
    plain = simulate(megatron(2, 1, m, grad_sync=True), four.baseline(), False)
    moe = simulate(add_expert_all_to_alls(megatron(2, 1, m, grad_sync=True),
                                          four.expert_chunks()), four.baseline(), False)
    assert moe.iteration_s - plain.iteration_s >= fwd[1] + bwd[1] - 1e-12


def test_a_rank_holds_its_share_of_the_experts_and_their_sharded_state():
    """Memory: an MoE layer's routed experts split over EP x expert TP (Megatron's default
    expert TP: the TP size), the rest over TP; the distributed optimizer's state of the
    experts at its own bytes per parameter (the expert data-parallel group's)."""
    from megatron_mm.plan.costs.hardware import MemoryModel
    from megatron_mm.plan.pipeline.memory import stage_memory

    experts = flops.expert_params(MOE)

    def layers(**work):
        chain = build_chain(_model(), Workload(seq_length=4096, **work))
        return chain, [l for l in chain if l.kind == "llm_layer"]

    _, plain = layers(tensor_model_parallel_size=2)
    chain, split = layers(tensor_model_parallel_size=2, expert_model_parallel_size=4)
    _, own_tp = layers(tensor_model_parallel_size=2, expert_model_parallel_size=4,
                       expert_tensor_parallel_size=1)
    assert split[0].params == plain[0].params and split[0].expert_params == 0  # dense
    for p, s, o in zip(plain[1:], split[1:], own_tp[1:]):
        assert s.expert_params == pytest.approx(experts / 8)
        assert p.params - s.params == pytest.approx(experts / 2 - experts / 8)
        assert o.expert_params == pytest.approx(experts / 4)
    bounds = [(0, len(chain))]
    dense_bytes = stage_memory(chain, bounds, 1, 1, 1, MemoryModel(7.5))[0][0]
    sharded = MemoryModel(7.5, bytes_per_trainable_expert_param=18.0)
    held = sum(l.expert_params for l in chain)
    assert stage_memory(chain, bounds, 1, 1, 1, sharded)[0][0] == pytest.approx(
        dense_bytes + held * (18.0 - 7.5))
    with pytest.raises(PlanError, match="--expert-tensor-parallel-size"):
        Workload(seq_length=8, expert_tensor_parallel_size=0)
