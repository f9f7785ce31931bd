"""The separate placement's costs (plan/schedules/separate_costs.py) charge the messages its
runtime sends: the encoder output from the encoder replica's first rank to each of the LLM
first stage's TP x CP ranks, the gradient from the stage's first rank to each encoder-TP
rank (the copies' bytes adding on the sender's link), and the DeepStack layers' outputs
stacked in the tower's message; under context parallelism the CP all-reduce of a trained
encoder's gradient inside the LLM first stage's ``B(g, 0)``."""

import pytest

from megatron_mm.plan import StagePartition
from megatron_mm.plan.costs.hardware import Hardware, Interconnect
from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.actions import Kind
from megatron_mm.plan.schedules.separate import separate
from megatron_mm.plan.schedules.separate_costs import separate_costs
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate

from helpers import vlm_chain

# 1 s of latency and 1 byte/s: a message of n bytes takes 1 + n seconds
LINKS = Interconnect(p2p_bandwidth=1.0, p2p_latency_s=1.0)


def _chain(deepstack=0.0):
    """2 ViT layers (trained) whose output is 3 bytes per rank, 2 LLM layers; the last ViT
    layer carries ``deepstack`` bytes of DeepStack outputs."""
    chain = vlm_chain(2, 2, freeze_vit=False)
    vit = [l for l in chain if l.kind == "vision_layer"]
    for l in vit:
        l.out_bytes = 3.0
    vit[-1].deepstack_bytes = deepstack
    return chain


def _costs(chain, tp=1, cp=1, etp=1):
    return separate_costs(chain, StagePartition(1, 1, [4]), Hardware(), links=LINKS,
                          tensor_model_parallel_size=tp, context_parallel_size=cp,
                          encoder_tensor_model_parallel_size=etp).costs


def test_one_member_each_side_sends_one_message_each_way():
    costs = _costs(_chain())
    assert costs.encoder_output_p2p_s == costs.encoder_grad_p2p_s == [1.0 + 3.0]


def test_the_output_fans_out_to_the_llm_stage_and_the_gradient_to_the_encoder_tp():
    # the output whole (3 bytes per rank x TP 2) to TP 2 x CP 2 = 4 ranks from one rank; the
    # gradient to the encoder's 2 TP ranks, whatever the LLM's
    costs = _costs(_chain(), tp=2, cp=2, etp=2)
    assert costs.encoder_output_p2p_s == [1.0 + 4 * 6.0]
    assert costs.encoder_grad_p2p_s == [1.0 + 2 * 6.0]
    assert _costs(_chain(), tp=2, cp=2, etp=1).encoder_grad_p2p_s == [1.0 + 6.0]
    # the simulator charges each direction its own
    program = separate(ScheduleProblem(1, 1, llm_data_parallel_size=1,
                                       encoder_data_parallel_size=1, costs=costs))
    at = {(t.kind, t.microbatch): t for t in simulate(program, costs).timeline}
    assert at[(Kind.F, 0)].start_s == at[(Kind.EF, 0)].end_s + 25.0
    assert at[(Kind.EB, 0)].start_s == at[(Kind.B, 0)].end_s + 13.0


def test_the_deepstack_outputs_ride_the_towers_message():
    costs = _costs(_chain(deepstack=6.0), tp=2, cp=2, etp=2)
    assert costs.encoder_output_p2p_s == [1.0 + 4 * 18.0]
    assert costs.encoder_grad_p2p_s == [1.0 + 2 * 18.0]
    # and the merged features beside the LLM chunks' outputs, as for coarse / bubble
    chain = _chain()
    next(l for l in chain if l.kind == "llm_layer").deepstack_bytes = 5.0
    two = separate_costs(chain, StagePartition(2, 1, [2, 2]), Hardware(), links=LINKS).costs
    assert two.deepstack_p2p_s == [1.0 + 5.0, 0.0]


def test_the_gradient_is_summed_over_the_cp_ranks_before_it_goes_back():
    # B(g, 0) all-reduces the gradient of the whole message (3 bytes per rank x TP 2, its
    # DeepStack 6 bytes stacked after it) over CP 2: 2 s of latency + 2 (2 - 1) / 2 x 18
    # bytes at 1 byte/s, in chunk 0's backward; none without CP or for a frozen encoder
    links = Interconnect(p2p_bandwidth=1.0, p2p_latency_s=1.0, tp_bandwidth=1.0,
                         tp_latency_s=2.0)

    def backward(cp, freeze=False):
        chain = _chain(deepstack=6.0)
        if freeze:
            for l in chain:
                if l.kind.startswith("vision_"):
                    l.trainable = False
        return separate_costs(chain, StagePartition(1, 1, [4]), Hardware(), links=links,
                              tensor_model_parallel_size=2, context_parallel_size=cp,
                              encoder_tensor_model_parallel_size=2).costs.backward_s

    assert backward(2)[0] == backward(1)[0] + 2.0 + 18.0
    assert backward(2, freeze=True) == backward(1, freeze=True)
    # and the simulator's gradient leaves that much later
    chain = _chain(deepstack=6.0)
    costs = separate_costs(chain, StagePartition(1, 1, [4]), Hardware(), links=links,
                           tensor_model_parallel_size=2, context_parallel_size=2,
                           encoder_tensor_model_parallel_size=2).costs
    program = separate(ScheduleProblem(1, 1, llm_data_parallel_size=1,
                                       encoder_data_parallel_size=1, costs=costs))
    at = {(t.kind, t.microbatch): t for t in simulate(program, costs).timeline}
    assert at[(Kind.EB, 0)].start_s == pytest.approx(
        at[(Kind.F, 0)].end_s + backward(1)[0] + 20.0 + costs.encoder_grad_p2p_s[0])


def test_the_lookahead_waits_for_the_llm_without_a_message():
    # EF(1) waits for F(0, 0) (lookahead 1): a dependency without payload, no p2p_s
    costs = ActionCosts([1.0], [2.0], [1.0], [0.0], p2p_s=5.0)
    program = separate(ScheduleProblem(1, 2, llm_data_parallel_size=1,
                                       encoder_data_parallel_size=1, encoder_trainable=False,
                                       lookahead=1, costs=costs))
    at = {(t.kind, t.microbatch): t for t in simulate(program, costs).timeline}
    assert at[(Kind.EF, 1)].start_s == at[(Kind.F, 0)].end_s
