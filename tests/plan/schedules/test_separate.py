"""The separate (non-colocated) placement's program (plan/schedules/separate.py): valid,
NCCL-safe over a grid of sizes (each rank run by several processes too: the LLM's TP x CP
ranks, an encoder replica's TP ranks, an MoE LLM's replicas meeting in the experts'
all-to-alls), the encoder replicas sharing the micro-batches whatever
the two data-parallel sizes, a bounded lookahead, and the world's sizes checked up front."""

import itertools

import pytest

from megatron_mm.plan.errors import PlanError
from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.actions import Kind, validate
from megatron_mm.plan.schedules.p2p import check_rendezvous, p2p_program
from megatron_mm.plan.schedules.separate import (Members, check_members, expert_replicas,
                                                 placement_sizes, separate)
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate


def _costs(pp, vpp=1, encoder_forward=(1.0,), encoder_backward=(2.0,), p2p=0.0):
    return ActionCosts([1.0] * (pp * vpp), [2.0] * (pp * vpp), list(encoder_forward),
                       list(encoder_backward), p2p_s=p2p)


@pytest.mark.parametrize("pp,vpp,m,d,e,trainable,encoders", [
    c for c in itertools.product((1, 2, 4), (1, 2), (2, 4), (1, 2), (1, 2, 3), (True, False),
                                 (1, 2))
    if not (c[1] > 1 and (c[0] == 1 or c[2] % c[0]))])
def test_every_separate_program_is_valid_and_rendezvous_safe(pp, vpp, m, d, e, trainable,
                                                             encoders):
    s = separate(ScheduleProblem(pp, m, virtual_pipeline_model_parallel_size=vpp,
                                 llm_data_parallel_size=d, encoder_data_parallel_size=e,
                                 encoder_trainable=trainable, encoders=encoders,
                                 frozen_encoders=[1] if encoders > 1 else []))
    assert len(s.ranks) == d * pp + e
    program = p2p_program(s, s.ranks)
    check_rendezvous(program)
    # LLM TP 2 x CP 2 and encoder TP 2: the encoder messages fanned out to every member
    check_members(s, s.ranks, program, Members(llm=4, encoder=2, llm_ranks=d * pp))
    # an MoE LLM at TP 2 with its experts over ETP 2 x EP d: each stage's ranks of every
    # replica meet in the experts' all-to-alls
    together = expert_replicas(2, 1, d, 2)
    moe = separate(ScheduleProblem(pp, m, virtual_pipeline_model_parallel_size=vpp,
                                   llm_data_parallel_size=d, encoder_data_parallel_size=e,
                                   encoder_trainable=trainable, encoders=encoders,
                                   frozen_encoders=[1] if encoders > 1 else [],
                                   lockstep_replicas=together))
    check_members(moe, moe.ranks, p2p_program(moe, moe.ranks), Members(
        llm=2, llm_ranks=d * pp, llm_stages=pp, lockstep_replicas=together))
    forward_only = [[a for a in r if a.kind in (Kind.F, Kind.EF)] for r in s.ranks]
    check_rendezvous(p2p_program(s, forward_only))


def test_encoder_messages_fan_out_to_every_member_and_the_check_sees_a_missing_one():
    members = Members(llm=4, encoder=2, llm_ranks=2)  # IR ranks 0-1 the LLM's, 2 encoder
    # an encoder output from the replica's first rank to each TP x CP rank of the stage,
    # its gradient from the stage's first rank to each encoder TP rank
    assert members.targets(2, 0, 0) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert members.targets(2, 1, 0) == []
    assert members.targets(0, 0, 2) == [(2, 0), (2, 1)] and members.targets(0, 3, 2) == []
    assert members.source(0, 3, 2) == (2, 0) and members.source(2, 1, 0) == (0, 0)
    # LLM stage to stage: member to the same member (TP and CP rank)
    assert members.targets(0, 3, 1) == [(1, 3)] and members.source(1, 3, 0) == (0, 3)

    class LeadOnly(Members):  # the output sent to the first TP rank only
        def targets(self, ir, k, peer):
            return super().targets(ir, k, peer)[:1]

    s = separate(ScheduleProblem(2, 4, llm_data_parallel_size=1, encoder_data_parallel_size=1))
    program = p2p_program(s, s.ranks)
    with pytest.raises(PlanError, match=r"deadlock.*rank 1 in exchange 0"):
        check_members(s, s.ranks, program, LeadOnly(llm=2, encoder=1, llm_ranks=2))


def test_expert_parallel_replicas_walk_together_and_the_check_sees_an_order_that_hangs():
    """With EP over the LLM's two replicas, their forwards and backwards pair up in the
    experts' all-to-alls: an encoder that waits for replica 0's gradient before encoding
    replica 1's first micro-batch hangs them (replica 0's backward waits for replica 1's),
    though without experts the same order runs."""
    # PP 1, 2 micro-batches on each of 2 LLM replicas
    s = separate(ScheduleProblem(1, 2, llm_data_parallel_size=2, encoder_data_parallel_size=1))
    members = Members(llm_ranks=2, lockstep_replicas=expert_replicas(1, 1, 2, None))
    # EP 2 pairs two replicas at TP 1, or TP 2 with ETP 2; at TP 2 with ETP 1, or CP 2,
    # its groups stay inside one replica
    assert [expert_replicas(*sizes) for sizes in [(1, 1, 2, None), (2, 1, 2, 1),
                                                  (2, 1, 2, 2), (1, 2, 2, None)]] == [2, 1, 2, 1]
    check_members(s, s.ranks, p2p_program(s, s.ranks), members)
    encoder = s.ranks[2]  # EF 0, EF 2, EF 1, EF 3, EB 0, ...: replica 1's 0 is 2
    assert [(a.kind, a.microbatch) for a in encoder[:2]] == [(Kind.EF, 0), (Kind.EF, 2)]
    lists = s.ranks[:2] + [[encoder[0], encoder[4]] + encoder[1:4] + encoder[5:]]
    program = p2p_program(s, lists)
    check_members(s, lists, program, Members(llm_ranks=2))
    with pytest.raises(PlanError, match=r"deadlock.*rank 0 in F\(micro-batch 0"):
        check_members(s, lists, program, members)


@pytest.mark.parametrize("pp,vpp,m,d,sizes,trainable,frozen", [
    c for c in itertools.product((1, 2), (1, 2), (2, 4), (1, 2), ((1, 1), (2, 1), (1, 3)),
                                 (True, False), ((), (0,)))
    if not (c[1] > 1 and (c[0] == 1 or c[2] % c[0]))])
def test_each_encoder_on_replicas_of_its_own_is_valid_and_rendezvous_safe(
        pp, vpp, m, d, sizes, trainable, frozen):
    # vision and audio, each on its own replicas (the first sizes[0] ranks after the LLM's
    # the ViT's, then the audio encoder's); a frozen ViT beside a trainable audio encoder
    s = separate(ScheduleProblem(pp, m, virtual_pipeline_model_parallel_size=vpp,
                                 llm_data_parallel_size=d, encoder_data_parallel_size=sum(sizes),
                                 encoder_trainable=trainable, encoders=2, frozen_encoders=frozen,
                                 encoder_data_parallel_sizes=sizes))
    assert len(s.ranks) == d * pp + sum(sizes)
    for e in range(sum(sizes)):
        mine = s.ranks[s.encoder_rank(e)]
        encoder = 0 if e < sizes[0] else 1  # runs only its encoder (a spare replica none)
        assert {a.chunk for a in mine} <= {encoder}
        assert [a.microbatch for a in mine if a.kind == Kind.EF] == s.replica_microbatches(e)
    for p in (0, 1):
        ef = sorted(a.microbatch for e in range(sum(sizes)) for a in s.ranks[s.encoder_rank(e)]
                    if a.kind == Kind.EF and a.chunk == p)
        assert ef == list(range(d * m))
    check_rendezvous(p2p_program(s, s.ranks))
    forward_only = [[a for a in r if a.kind in (Kind.F, Kind.EF)] for r in s.ranks]
    check_rendezvous(p2p_program(s, forward_only))


def test_encoder_replicas_share_the_micro_batches_in_the_order_the_llm_needs_them():
    # 2 LLM replicas x 3 micro-batches over 3 encoder replicas: LLM replica 0's local
    # micro-batch m is g = m, replica 1's g = 3 + m; needed m-major: 0, 3, 1, 4, 2, 5
    s = separate(ScheduleProblem(2, 3, llm_data_parallel_size=2, encoder_data_parallel_size=3))
    assert [s.replica_microbatches(e) for e in range(3)] == [[0, 4], [3, 2], [1, 5]]
    for e in range(3):
        rank = s.ranks[s.encoder_rank(e)]
        assert [a.microbatch for a in rank if a.kind == Kind.EF] == s.replica_microbatches(e)
        assert {a.microbatch for a in rank if a.kind == Kind.EB} == set(
            s.replica_microbatches(e))
    # the LLM ranks run Megatron-Core's 1F1B on their own micro-batches only
    assert {a.microbatch for a in s.ranks[2] + s.ranks[3]} == {3, 4, 5}


def test_a_frozen_encoder_runs_at_most_lookahead_micro_batches_ahead():
    # a fast frozen encoder would encode every micro-batch up front; the lookahead holds
    # it to 2 outputs the LLM has not started on
    s = separate(ScheduleProblem(2, 8, llm_data_parallel_size=1, encoder_data_parallel_size=1,
                                 encoder_trainable=False, lookahead=2,
                                 costs=_costs(2, encoder_forward=[0.1], encoder_backward=[0.0])))
    sim = simulate(s, _costs(2, encoder_forward=[0.1], encoder_backward=[0.0]))
    started = {t.microbatch: t.start_s for t in sim.timeline if t.kind == Kind.F
               and t.chunk == 0}
    for t in sim.timeline:
        if t.kind == Kind.EF:
            ahead = [g for g in range(8) if g < t.microbatch and started[g] > t.start_s]
            assert len(ahead) <= 2, (t, ahead)
    fast = _costs(2, encoder_forward=[0.1], encoder_backward=[0.0])
    unbounded = separate(ScheduleProblem(2, 8, llm_data_parallel_size=1,
                                         encoder_data_parallel_size=1, encoder_trainable=False,
                                         lookahead=8, costs=fast))
    assert [a.microbatch for a in unbounded.ranks[2]] == list(range(8))
    assert max(t.end_s for t in simulate(unbounded, fast).timeline
               if t.kind == Kind.EF) == pytest.approx(0.8)


def test_a_heavy_encoder_over_more_replicas_shortens_the_iteration():
    heavy = _costs(2, encoder_forward=[3.0], encoder_backward=[6.0])
    times = [simulate(separate(ScheduleProblem(2, 8, llm_data_parallel_size=1,
                                               encoder_data_parallel_size=e, costs=heavy)),
                      heavy).iteration_s
             for e in (1, 2, 4)]
    assert times[0] > times[1] > times[2]
    assert times[0] >= 8 * 9.0  # one replica runs all of the encoder's work


def test_the_lookahead_is_a_dependency_the_validator_checks():
    s = separate(ScheduleProblem(2, 4, llm_data_parallel_size=1, encoder_data_parallel_size=1,
                                 encoder_trainable=False, lookahead=1))
    enc = s.ranks[2]
    assert s.dependencies(enc[1]) == [(Kind.F, 0, 0)]
    # the encoder's forward of micro-batch 1 moved before the LLM could start micro-batch
    # 0 is still valid; one of micro-batch 2 before 1 is not (it waits for F(1, 0), which
    # waits for the encoder's output of 1)
    enc[1], enc[2] = enc[2], enc[1]
    with pytest.raises(PlanError, match="deadlocks"):
        validate(s)


def test_the_worlds_sizes_must_leave_whole_llm_replicas():
    sizes = placement_sizes(6, 1, 2, 1, 1, 2)
    assert (sizes.encoder_ranks, sizes.llm_data_parallel_size) == (2, 2)
    assert placement_sizes(5, 2, 1, 1, 1, 1).llm_data_parallel_size == 2
    with pytest.raises(PlanError, match=r"--encoder-data-parallel-size 1\) leave 3 for the "
                                        r"LLM, not a multiple of .* \(2\)"):
        placement_sizes(4, 1, 2, 1, 1, 1)
    with pytest.raises(PlanError, match="leave 0 for the LLM"):
        placement_sizes(2, 1, 1, 1, 2, 1)
    with pytest.raises(PlanError, match="--encoder-data-parallel-size must be at least 1"):
        placement_sizes(4, 1, 1, 1, 1, 0)
    # each encoder on replicas of its own: their sum is taken
    own = placement_sizes(6, 1, 2, 1, 1, 2, [1, 1])
    assert (own.encoder_ranks, own.llm_data_parallel_size) == (2, 2)
    with pytest.raises(PlanError, match=r"\(--vision-encoder-data-parallel-size 2 \+ "
                                        r"--audio-encoder-data-parallel-size 1\)\) leave 3 for "
                                        r"the LLM"):
        placement_sizes(6, 1, 2, 1, 1, 1, [2, 1], ["vision", "audio"])


def test_the_llm_posts_an_encoder_outputs_receive_only_within_the_lookahead():
    # the p2p program's timeline honours the lookahead: LLM rank 0 receives the output of
    # micro-batch g (exchange k runs before its action k) only after it started F(g - 2, 0)
    fast = _costs(2, encoder_forward=[0.1], encoder_backward=[0.0])
    s = separate(ScheduleProblem(2, 8, llm_data_parallel_size=1, encoder_data_parallel_size=1,
                                 encoder_trainable=False, lookahead=2, costs=fast))
    program = p2p_program(s, s.ranks)
    first = s.ranks[0]
    forward_at = {a.microbatch: i for i, a in enumerate(first) if a.kind == Kind.F}
    received_at = {t.key[1]: k for k, ex in enumerate(program[0]) for t in ex.recvs
                   if t.key[0] == "EF"}
    assert sorted(received_at) == list(range(8))
    for g in range(2, 8):
        assert received_at[g] > forward_at[g - 2], (g, received_at, forward_at)


@pytest.mark.processes
def test_simulate_schedule_tool_prints_a_separate_row(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parents[3] / "tools" / "simulate_schedule.py"
    proc = subprocess.run([sys.executable, str(tool), "--encoder-forward", "2",
                           "--encoder-backward", "4", "--encoder-data-parallel-size", "1",
                           "--png-out", str(tmp_path / "t.png")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # 4 LLM ranks at 8 x (1 + 2) each plus 1 encoder rank at 8 x (2 + 4): the encoder rank
    # is the longest, its first forward and last backward outside the LLM's work
    row = proc.stdout.splitlines()[-1]
    assert row.startswith("| separate | 51.00 |") and "24.0, 24.0, 24.0, 24.0, 48.0" in row
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    # vision (trained) + audio (frozen) on encoder ranks of their own, next to one LLM rank
    # of TP 2 x CP 2: the ViT's output (0.5 a copy) reaches it at 4 copies x 0.5 = 2 after
    # its forward (F 1, B 2), the gradient the ViT's 2 TP ranks at 2 x 0.5 after the B, which
    # first sums it over the CP ranks (by default the ring's 2 (2 - 1) / 2 x 0.5)
    proc = subprocess.run([sys.executable, str(tool), "--pipeline-model-parallel-size", "1",
                           "--num-microbatches", "1", "--encoder-forward", "2", "1",
                           "--encoder-backward", "4", "0", "--encoder-data-parallel-size", "1",
                           "1", "--encoder-message", "0.5", "0.25",
                           "--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                           "--encoder-tensor-model-parallel-size", "2"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("| separate | 12.50 | 0.720 | 3.5, 6.0, 1.0 |")


def test_the_encoder_output_send_and_the_replicas_gradient_sum_are_charged():
    """``separate_costs``' two charges besides compute: each encoder output's send to the
    LLM (and its gradient's back) delays the consumer by its seconds, and the encoder
    replicas' gradient sum follows their last backward (``separate_iteration_s``)."""
    from megatron_mm.plan.schedules.separate_costs import SeparateCosts, separate_iteration_s

    costs = ActionCosts([1.0], [2.0], [3.0], [4.0], encoder_output_p2p_s=[0.5])
    program = separate(ScheduleProblem(1, 2, llm_data_parallel_size=1,
                                       encoder_data_parallel_size=2, costs=costs))
    sim = simulate(program, costs)
    at = {(t.kind, t.microbatch): t for t in sim.timeline}
    assert at[(Kind.F, 0)].start_s == at[(Kind.EF, 0)].end_s + 0.5
    assert at[(Kind.EB, 0)].start_s == at[(Kind.B, 0)].end_s + 0.5
    last_encoder = max(t.end_s for t in sim.timeline if t.kind == Kind.EB)
    assert separate_iteration_s(program, SeparateCosts(costs, 0.0)) == sim.iteration_s
    assert separate_iteration_s(program, SeparateCosts(costs, 100.0)) == last_encoder + 100.0
