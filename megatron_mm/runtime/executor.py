"""Run any valid ``plan.actions.Schedule`` with Megatron-Core's building blocks.

Each rank walks its own action list: ``F`` / ``B`` are Megatron-Core's ``forward_step`` /
``backward_step`` on an LLM model chunk (losses, per-token scaling, grad-scale hooks as
in its schedules), ``EF`` / ``EB`` run and differentiate one encoder piece
(``MultimodalModel.run_encoder_piece``); ``F(m, 0)`` takes every encoder's output and
``B(m, 0)`` hands each its gradient; the collectives are actions too (``BCAST``,
``ALLREDUCE``, ``GRAD_SYNC``, below). Tensors between actions stay local when producer
and consumer share a rank, else travel in the exchanges ``plan/schedules/p2p.py`` lays out: before
each action one batched exchange (``Mailbox``) sends what the previous action produced and
receives what this one needs (and what its peers sent before that), sized from the
micro-batch (``MessageSpecs``), in an order NCCL cannot deadlock. Every received tensor is
cut from the producer's graph, so every action's backward stops at its own inputs; the
gradient of each input goes back to its producer. After the last action, Megatron-Core's
``finalize_model_grads`` reduces gradients over data-parallel ranks and tied embeddings
exactly as after its own schedules.

With encoder replicas (``--encoder-tensor-model-parallel-size`` below the LLM's TP,
``encoder_replicas.py``) a rank runs only the ``EF`` / ``EB`` actions of the micro-batches
its replica owns; encoder pieces talk over the pipeline group as before (same TP rank, same
replica). ``F(m, 0)`` broadcasts the encoder output over the LLM's TP group from the owner
replica's first rank; its gradient is the same on every TP rank (the LLM's column-parallel
input all-reduces it), so only the owner's ranks take it in ``B(m, 0)`` and send it to
``EB``. Before gradient finalisation the encoder pieces' gradients
are summed over the replicas (the loss is per token, so a sum is what one replica holding
every micro-batch would have).

What Megatron-LM sets on the model's config for its schedules is done here too:
``no_sync_func`` (``_OverlappedGradSync``, also with ``force_all_reduce``),
``param_sync_func`` (``--overlap-param-gather`` with its aligned gathers, VPP: each model
chunk's all-gather dispatched ahead of its first forward, ``_ParamSync``) and
``defer_embedding_wgrad_compute`` (the output layer's weight gradient computed from its
buffers once the last chunk's backwards are done, ``_EmbeddingWgrad``); what needs
Megatron-Core's own schedules is refused (``schedule_call.check_config``).

``ScheduleExecutor`` is called like the function ``get_forward_backward_func()`` returns,
so training, evaluation and generation run through it unchanged.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel.schedules import (backward_step,
                                                      deallocate_output_tensor, forward_step)
from megatron.core.utils import (drain_embedding_wgrad_compute, get_attr_wrapped_model,
                               get_model_config)

from ..plan.schedules.actions import Action, Kind, Schedule, validate
from ..plan.errors import PlanError
from ..plan.schedules.encoder_pipeline import EncoderPieces
from ..plan.schedules.p2p import (Exchange, carried_by, check_replicas, forward_key,
                                  message_inputs, output_grad_key, p2p_program)
from ..plan.pipeline.placement import ChunkPlacement
from ..plan.schedules.simulate import TimedAction
from . import deepstack_carry
from .encoder_replicas import EncoderReplicas
from .mailbox import Mailbox, Spec
from .message_specs import MessageSpecs
from .microbatches import Microbatches, NoData
from .schedule_call import ScheduleCall, check_call, check_config
from .timer import device_clock

Key = Tuple[str, int, int]


class ScheduleExecutor:
    """``make_schedule(num_microbatches)`` gives the schedule of an iteration (cached per
    micro-batch count); ``pieces`` (per encoder, in the schedule's piece order) say which
    encoder layers each ``EF`` runs; ``replicas`` this rank's encoder replica when the
    encoders' TP is below the LLM's; ``placements`` every model chunk's modules and
    ``local_length(batch)`` this context-parallel rank's token count (None: no CP), for
    the messages' shapes."""

    def __init__(self, make_schedule: Callable[[int], Schedule],
                 pieces: Sequence[EncoderPieces], to_device: Callable[[dict], dict],
                 replicas: Optional[EncoderReplicas] = None,
                 placements: Sequence[ChunkPlacement] = (),
                 local_length: Optional[Callable[[dict], int]] = None,
                 cost: Optional[Callable[[Action], float]] = None):
        self.make_schedule = make_schedule
        # the schedule's encoder piece s: (encoder name, its layers [start, end))
        self.pieces = [(enc.name, layers) for enc in pieces for layers in enc.layers]
        self.encoders = [enc.name for enc in pieces]
        self.to_device = to_device
        self.replicas = replicas  # None: one encoder replica per TP group (ETP = TP)
        self.placements, self.local_length = list(placements), local_length
        # seconds per action (the schedule's own costs): the p2p program posts each receive
        # when its message is due on that timeline (None: unit costs)
        self.cost = cost
        self._schedules: Dict[int, Schedule] = {}
        self._programs: Dict[Tuple[int, bool], List[List[Exchange]]] = {}
        self.record_timeline = False
        self.timeline: List[TimedAction] = []  # the last iteration's, when recorded

    def schedule(self, num_microbatches: int) -> Schedule:
        """The iteration's schedule, validated before any rank runs it."""
        if num_microbatches not in self._schedules:
            schedule = self.make_schedule(num_microbatches)
            validate(schedule)
            replicas = 1 if self.replicas is None else self.replicas.replicas
            if schedule.encoder_replicas != replicas:
                raise PlanError(f"schedule {schedule.name!r} is for {schedule.encoder_replicas}"
                                f" encoder replicas per TP group; this run has {replicas}")
            if schedule.encoder_grad_sync:  # the pieces share the first chunk's buffers
                raise PlanError(f"schedule {schedule.name!r} reduces the encoder pieces on "
                                "their own (ENCODER_GRAD_SYNC); this runtime reduces them "
                                "with the first model chunk (GRAD_SYNC)")
            if any(a.in_tp_bubble for r in schedule.ranks for a in r):
                raise PlanError(f"schedule {schedule.name!r} runs encoder work inside TP "
                                "communication (in_tp_bubble); this runtime runs one action "
                                "at a time")
            if schedule.num_microbatches != num_microbatches:
                raise PlanError(f"schedule {schedule.name!r} has {schedule.num_microbatches} "
                                f"micro-batches; the iteration has {num_microbatches}")
            self._schedules[num_microbatches] = schedule
        return self._schedules[num_microbatches]

    def actions(self, schedule: Schedule, rank: int, forward_only: bool) -> List[Action]:
        """Pipeline rank ``rank``'s actions of ``schedule``: forwards only need forwards
        (their order stays valid). With encoder replicas every replica walks the same list
        and exchanges at the same points (``owns`` says which encoder actions it runs):
        the LLM's TP collectives then meet the same p2p program in every replica, which is
        what ``check_rendezvous`` proved free of deadlock (a replica only leaves out
        messages, both sides of each)."""
        actions = schedule.ranks[rank]
        if forward_only:
            actions = [a for a in actions if a.kind in (Kind.F, Kind.EF, Kind.BCAST, Kind.A2A)]
        return list(actions)

    def owns(self, a: Action) -> bool:
        """Whether this process's encoder replica runs ``a`` (every non-encoder action)."""
        return (self.replicas is None or a.kind not in (Kind.EF, Kind.EB)
                or self.replicas.owns(a.microbatch))

    def carries(self, key: Key) -> bool:
        """Whether message ``key`` travels in this replica (``p2p.carried_by``)."""
        return self.replicas is None or carried_by(key, self.replicas.index,
                                                   self.replicas.replicas)

    def program(self, schedule: Schedule, forward_only: bool) -> List[List[Exchange]]:
        """Every pipeline rank's exchanges (cached per micro-batch count and mode)."""
        key = (schedule.num_microbatches, forward_only)
        if key not in self._programs:
            ranks = [self.actions(schedule, r, forward_only)
                     for r in range(schedule.num_ranks)]
            self._programs[key] = p2p_program(schedule, ranks, self.cost)
            check_replicas(schedule, ranks, self._programs[key])
        return self._programs[key]

    def __call__(self, *, forward_step_func, data_iterator, model, num_microbatches: int,
                 seq_length: Optional[int] = None, micro_batch_size: Optional[int] = None,
                 decoder_seq_length: Optional[int] = None, forward_only: bool = False,
                 collect_non_loss_data: bool = False, first_val_step: Optional[bool] = None,
                 adjust_tensor_shapes_fn: Optional[Callable] = None, p2p_communicator=None,
                 pg_collection=None, force_all_reduce: Optional[bool] = False) -> list:
        """Megatron-Core 0.19.2's forward-backward signature, every keyword honoured or
        refused (``schedule_call.py``)."""
        call = check_call(self.exchange_group, seq_length=seq_length,
                          micro_batch_size=micro_batch_size,
                          decoder_seq_length=decoder_seq_length, forward_only=forward_only,
                          collect_non_loss_data=collect_non_loss_data,
                          first_val_step=first_val_step,
                          adjust_tensor_shapes_fn=adjust_tensor_shapes_fn,
                          p2p_communicator=p2p_communicator, pg_collection=pg_collection,
                          force_all_reduce=force_all_reduce)
        schedule = self.schedule(num_microbatches)
        model = model if isinstance(model, list) else [model]
        check_config(get_model_config(model[0]))
        iterators = data_iterator if isinstance(data_iterator, list) else [data_iterator]
        batches = Microbatches(iterators, num_microbatches, self.schedule_rank())
        run = _Iteration(self, schedule, model, batches, forward_step_func, call)
        run.execute()
        batches.finish()
        if self.record_timeline:
            self.timeline = run.timeline
        return run.forward_data_store

    # -- where this process runs in the schedule (a pipeline's ranks here; the separate
    # placement's executor maps the whole world) --------------------------------------------
    def schedule_rank(self) -> int:
        """This process's rank in the schedule."""
        return parallel_state.get_pipeline_model_parallel_rank()

    def exchange_group(self):
        """The group the schedule's messages travel in."""
        return parallel_state.get_pipeline_model_parallel_group()

    def peer(self, rank: int) -> int:
        """Schedule rank ``rank`` as a rank of ``exchange_group``."""
        return rank

    def send_peers(self, rank: int) -> List[int]:
        """The ranks of ``exchange_group`` a message for schedule rank ``rank`` goes to."""
        return [self.peer(rank)]

    def recv_peer(self, rank: int) -> int:
        """The rank of ``exchange_group`` a message of schedule rank ``rank`` comes from."""
        return self.peer(rank)

    def encoder_output_grads(self, inputs: list, grads: list) -> list:
        """``B(m, 0)``'s gradients of the encoders' outputs ``inputs`` as this rank hands
        them back."""
        return grads

    def loss_tokens(self, num_tokens):
        """The token count this rank hands gradient finalisation (its loss tokens)."""
        return num_tokens


class _Iteration:
    def __init__(self, executor: ScheduleExecutor, schedule: Schedule, model: List,
                 batches: Microbatches, forward_step_func, call: ScheduleCall):
        self.x, self.s, self.model, self.batches = executor, schedule, model, batches
        self.forward_step_func, self.call = forward_step_func, call
        self.forward_only, self.collect = call.forward_only, call.collect_non_loss_data
        forward_only = call.forward_only
        self.config = get_model_config(model[0])
        self.rank = executor.schedule_rank()
        self.mailbox = Mailbox(call.group or executor.exchange_group(), _device_of(model[0]))
        self.actions = executor.actions(schedule, self.rank, forward_only)
        # each chunk's first forward of the iteration (FP8 weight casts are made there);
        # a schedule need not run micro-batch 0 first
        self.first_forward: Dict[int, int] = {}
        for a in self.actions:
            if a.kind == Kind.F:
                self.first_forward.setdefault(a.chunk, a.microbatch)
        if executor.encoders:  # ``execute`` marks model[0] (chunks below PP) up front;
            # marking it again at its first F would re-cast encoder pieces' FP8 weights
            pp = schedule.pipeline_model_parallel_size
            self.first_forward = {c: m for c, m in self.first_forward.items() if c >= pp}
        self.program = executor.program(schedule, forward_only)[self.rank]
        # A forward step marked ``whole_sequence`` (generation) runs every token on every
        # context-parallel rank: its hidden states travel whole.
        whole = getattr(forward_step_func, "whole_sequence", False)
        self.specs = MessageSpecs(model[0], executor.pieces, executor.placements,
                                  None if whole else executor.local_length)
        self._specs: Dict[Key, Optional[Spec]] = {}
        self.local: Dict[Key, Optional[torch.Tensor]] = {}  # messages to this same rank
        self.outbox: Dict[Key, Tuple[int, Optional[torch.Tensor]]] = {}  # for the next exchange
        self.inbox: Dict[Key, Optional[torch.Tensor]] = {}  # received, not yet used
        self.saved: Dict[Key, Tuple] = {}  # (inputs, output) per forward, for its backward
        self.idle = set()  # encoder pieces' FP8 runs on zeros (no media), for their backward
        self.forward_data_store: list = []
        self.num_tokens = torch.zeros((), dtype=torch.int, device=self.mailbox.device)
        self.media: Dict[int, dict] = {}
        # Each micro-batch's prepared encoder batch (a variable-length encoder's windows,
        # masks, rotary positions), built once from its host media for all the pieces this
        # rank runs of it, dropped after the last of them.
        self.encoder_batches: Dict[Tuple[int, str], object] = {}
        self.encoder_forwards_left = Counter(
            (a.microbatch, executor.pieces[a.chunk][0]) for a in self.actions
            if a.kind == Kind.EF and executor.owns(a))
        self.timeline: List[TimedAction] = []
        self.replicas = executor.replicas
        self.inputs_ready = 0.0  # when the running action's last input arrived

    # -- plumbing --------------------------------------------------------------------
    def now(self) -> float:
        """The timeline's clock: after the device's queued work, when recording."""
        return device_clock(self.mailbox.device) if self.x.record_timeline else 0.0

    def rank_of(self, kind: str, m: int, chunk: int) -> int:
        return self.s.rank_of(Action(kind, m, chunk))

    def send(self, to_rank: int, key: Key, tensor: Optional[torch.Tensor]) -> None:
        if tensor is not None:
            tensor = tensor.detach()
        if to_rank == self.rank:
            self.local[key] = tensor
        else:
            self.outbox[key] = (to_rank, tensor)

    def receive(self, from_rank: int, key: Key, needs_grad: bool) -> Optional[torch.Tensor]:
        """The tensor ``key`` as a fresh leaf of this action's graph."""
        if from_rank != self.rank:
            self.mailbox.take(key)
        tensor = (self.local if from_rank == self.rank else self.inbox).pop(key)
        if tensor is not None:
            tensor = tensor.detach().requires_grad_(needs_grad and tensor.is_floating_point())
        return tensor

    def spec(self, key: Key) -> Optional[Spec]:
        """What message ``key`` carries (from micro-batch ``key[1]``, cached)."""
        if key not in self._specs:
            batch = self.batch(key[1], f"message {key} (its shape)", fixed_ok=True)
            if batch is not None and forward_key(key)[0] != "EF":
                self.check_fixed_shape(key, batch)
            self._specs[key] = (self.specs.of(key, batch) if batch is not None else
                                self.specs.fixed(key, self.call.micro_batch_size,
                                                 self.call.seq_length))
        return self._specs[key]

    def check_fixed_shape(self, key: Key, batch: dict) -> None:
        """Without ``variable_seq_lengths`` an LLM message is [seq_length, micro_batch_size,
        H] (Megatron-Core's fixed shapes, what a stage without data sizes it by): the
        micro-batch must have that shape."""
        call = self.call
        if self.config.variable_seq_lengths or not (call.seq_length and call.micro_batch_size):
            return
        shape = tuple(batch["tokens"].shape)
        if shape != (call.micro_batch_size, call.seq_length):
            raise ValueError(f"micro-batch {key[1]} has tokens of shape {list(shape)}; "
                             f"--micro-batch-size {call.micro_batch_size} and --seq-length "
                             f"{call.seq_length} say [{call.micro_batch_size}, "
                             f"{call.seq_length}] (message {key}: without variable_seq_lengths "
                             "the pipeline's messages have that shape)")

    def batch(self, m: int, why: str, fixed_ok: bool = False) -> Optional[dict]:
        """Micro-batch ``m`` (``why``: what needs it); None on a stage without data where
        ``fixed_ok`` (Megatron-LM's fixed shapes do), else ``NoData`` saying what needed
        it."""
        fixed = not self.config.variable_seq_lengths
        if not self.batches.has_data and fixed_ok and fixed:
            return None
        try:
            batch = self.batches[m]
        except NoData as e:
            raise NoData(f"{e}: {why}" + ("" if fixed else " (the model's config has "
                                            "variable_seq_lengths: each micro-batch is "
                                            "padded to its own length)")) from None
        return batch

    def exchange(self, i: int) -> None:
        """Exchange ``i`` of this rank's program: the sends of action ``i - 1`` and the
        receives due before action ``i``, in one batch."""
        ex = self.program[i]
        sends = []
        for t in ex.sends:
            key = tuple(t.key)
            if not self.x.carries(key):
                continue
            to_rank, tensor = self.outbox.pop(key)
            assert to_rank == t.peer, f"{key} goes to rank {to_rank}, the plan says {t.peer}"
            sends += [(peer, key, tensor, self.spec(key)) for peer in self.x.send_peers(t.peer)]
        assert not self.outbox, f"messages the p2p plan does not list: {sorted(self.outbox)}"
        recvs = [(self.x.recv_peer(t.peer), tuple(t.key), self.spec(tuple(t.key)))
                 for t in ex.recvs
                 if self.x.carries(tuple(t.key))]
        if sends or recvs:
            self.inbox.update(self.mailbox.exchange(sends, recvs))

    def media_of(self, m: int) -> dict:
        if m not in self.media:
            self.media[m] = self.x.to_device({**self.batch(m, "encoder media")})["media"]
        return self.media[m]

    def encoder_batch(self, m: int, name: str):
        """Micro-batch ``m``'s prepared batch of encoder ``name``, for one more piece."""
        key = (m, name)
        if key not in self.encoder_batches:
            self.encoder_batches[key] = get_attr_wrapped_model(
                self.model[0], "prepare_encoder_media")(
                    name, self.batch(m, "encoder media")["media"])
        self.encoder_forwards_left[key] -= 1
        if self.encoder_forwards_left[key] > 0:
            return self.encoder_batches[key]
        return self.encoder_batches.pop(key)

    def chunk(self, c: int):
        return self.model[c // self.s.pipeline_model_parallel_size]

    @property
    def encoder_trainable(self) -> bool:
        return self.s.encoder_trainable and not self.forward_only

    def runs_encoder(self, m: int) -> bool:
        """Whether this rank's encoder replica owns micro-batch ``m`` (always, with one)."""
        return self.replicas is None or self.replicas.owns(m)

    # -- actions -----------------------------------------------------------------------
    def check_without_data(self) -> None:
        """On a stage without data, before any exchange: every action and message of
        this rank's part can go without (``NoData`` naming the first that cannot)."""
        for i, a in enumerate(self.actions):
            if self.x.owns(a) and (a.kind in (Kind.EF, Kind.EB) or (
                    a.kind == Kind.F and a.chunk == 0 and self.x.encoders)):
                raise NoData(f"pipeline rank {self.rank} was given no data iterator (Megatron-"
                             f"LM gives stages other than the first and last None), but the "
                             f"plan runs {a} here, which reads micro-batch {a.microbatch}'s "
                             "media: build the dataset on this rank too")
        for ex in self.program:
            for t in list(ex.sends) + list(ex.recvs):
                if self.x.carries(tuple(t.key)):
                    self.spec(tuple(t.key))

    def execute(self) -> None:
        actions = self.actions
        if not self.batches.has_data:
            self.check_without_data()
        if self.x.record_timeline:
            torch.distributed.barrier(group=self.x.exchange_group())
        overlap = _OverlappedGradSync(self, actions)
        params = _ParamSync(self, actions)
        wgrad = _EmbeddingWgrad(self, actions)
        if self.x.encoders:  # encoder pieces may run before their chunk's first forward,
            # which is where Megatron-Core's step marks the iteration's first micro-batch
            # (TE re-casts FP8 weights there): mark it for them up front
            get_attr_wrapped_model(self.model[0], "set_is_first_microbatch")()
        origin = self.now()
        for i, a in enumerate(actions):
            params.before(i)
            self.exchange(i)
            if not self.x.owns(a):  # another encoder replica's: only its exchange point
                overlap.after(i)
                continue
            for key, producer in message_inputs(self.s, a):  # its inputs have arrived
                if self.x.carries(key):
                    self.mailbox.take(key)
            self.inputs_ready = self.now()
            getattr(self, "run_" + a.kind)(a.microbatch, a.chunk)
            if self.x.record_timeline:  # from its inputs' arrival: waiting is idle time
                self.timeline.append(TimedAction(self.rank, a.kind, a.microbatch, a.chunk,
                                                 self.inputs_ready - origin,
                                                 self.now() - origin))
            wgrad.after(i)  # before the reduction of its chunk starts
            overlap.after(i)
        self.exchange(len(actions))
        self.mailbox.finish()
        assert not self.local, f"local messages never used: {sorted(self.local)}"
        assert not self.inbox, f"messages received but never used: {sorted(self.inbox)}"
        wgrad.after(len(actions))
        overlap.after(len(actions))  # a schedule without GRAD_SYNC: what had no backward
        if not self.forward_only and self.config.finalize_model_grads_func is not None:
            self.config.finalize_model_grads_func(
                self.model, self.x.loss_tokens(self.num_tokens)
                if self.config.calculate_per_token_loss else None,
                pg_collection=self.call.pg_collection,
                force_all_reduce=self.call.force_all_reduce)

    def trains(self, p: int) -> bool:
        """Whether encoder piece ``p`` runs its backward in this iteration."""
        return self.s.encoder_backward(p) and not self.forward_only

    def run_EF(self, m: int, p: int) -> None:
        first, end = self.s.encoder_span(p)
        hidden = (None if p == first else
                  self.receive(self.rank_of("EF", m, p - 1), ("EF", m, p - 1), self.trains(p)))
        run_piece = get_attr_wrapped_model(self.model[0], "run_encoder_piece")
        name, layers = self.x.pieces[p]
        enc = get_attr_wrapped_model(self.model[0], "mm_config").encoders[name]
        # the DeepStack layers' outputs the pieces before computed ride along (deepstack_carry)
        received, before = ((None, []) if hidden is None
                            else deepstack_carry.split(hidden, deepstack_carry.carried(
                                enc, layers[0])))
        # a variable-length encoder's windows and masks, from the host media (no sync)
        get_attr_wrapped_model(self.model[0], "bind_encoder_batch")(
            name, self.encoder_batch(m, name))
        # only the embedding piece reads the media; later ones their count (on the host)
        media = (self.media_of(m) if p == first
                 else self.batch(m, f"encoder piece {p}'s media")["media"])
        with torch.set_grad_enabled(self.trains(p)):
            out = run_piece(name, media, received, layers)
            if out is not None and deepstack_carry.carried(enc, layers[1]):
                kept = get_attr_wrapped_model(self.model[0], "encoder")(name).kept
                out = deepstack_carry.stack(out, before + [
                    kept[i] for i in deepstack_carry.deepstack_indexes(enc)
                    if layers[0] <= i < layers[1]])
            # no media: FP8 layers still enter their autocast, for the amax reductions
            idle = None if out is not None else get_attr_wrapped_model(
                self.model[0], "idle_encoder_piece")(name, layers)
        last = p == end - 1
        self.send(self.rank_of("F", m, 0) if last else self.rank_of("EF", m, p + 1), ("EF", m, p),
                  out)
        if self.trains(p):
            self.saved[("EF", m, p)] = (hidden, out if idle is None else idle)
            if idle is not None:  # its backward takes zeros (nothing downstream used it)
                self.idle.add(("EF", m, p))
            else:
                self.deallocate(out)

    def deallocate(self, output) -> None:
        """Megatron-Core's ``deallocate_output_tensor`` once the output is sent (the
        message keeps its data): with ``deallocate_pipeline_outputs`` (Megatron-LM's
        default) only its graph stays for the backward, which ``backward_step`` then runs
        as Megatron-Core's ``custom_backward``."""
        if output is not None and output.requires_grad:
            deallocate_output_tensor(output, self.config.deallocate_pipeline_outputs)

    def run_F(self, m: int, c: int) -> None:
        chunk = self.chunk(c)
        if c == 0:
            inputs = None
            if self.x.encoders:  # every encoder's output, a list as Megatron's steps take
                inputs = [self.encoder_output(m, end - 1) for _, end in self.s.encoder_spans()]
                hidden, kept = {}, {}
                mm_config = get_attr_wrapped_model(chunk, "mm_config")
                for name, x in zip(self.x.encoders, inputs):
                    enc = mm_config.encoders[name]
                    k = len(deepstack_carry.deepstack_indexes(enc))
                    hidden[name], features = ((x, []) if x is None
                                              else deepstack_carry.split(x, k))
                    if features:  # for the mergers, this chunk's
                        kept[name] = deepstack_carry.kept_by_layer(enc, features)
                get_attr_wrapped_model(chunk, "set_encoder_inputs")(hidden, kept)
        else:
            inputs = self.receive(self.rank_of("F", m, c - 1), ("F", m, c - 1),
                                  not self.forward_only)
        last = c == self.s.num_chunks - 1
        with torch.set_grad_enabled(not self.forward_only):
            output, num_tokens = forward_step(
                self.forward_step_func, self.data_for(m, c), chunk,
                self.s.num_microbatches, None if c == 0 else inputs, self.forward_data_store,
                self.config, cp_group_size=1, collect_non_loss_data=self.collect,
                is_first_microbatch=self.call.is_first_microbatch(
                    self.first_forward.get(c) == m),
                vp_stage=c // self.s.pipeline_model_parallel_size,
                is_last_stage=last)
        if c == 0 and self.x.encoders:
            get_attr_wrapped_model(chunk, "set_encoder_inputs")({})
        # As Megatron-Core's schedules accumulate it: the last stage's count is on the
        # device, other stages' a CPU scalar that the add takes as a kernel argument
        # (a .to(device) of it would be a blocking host-to-device copy per action).
        self.num_tokens += num_tokens
        if not last:
            self.send(self.rank_of("F", m, c + 1), ("F", m, c), output)
            self.deallocate(output)
        if not self.forward_only:
            self.saved[("F", m, c)] = (inputs, output)

    def data_for(self, m: int, c: int):
        """What ``forward_step_func`` reads for ``F(m, c)``: micro-batch ``m`` where this
        stage has data, else None (Megatron-LM's ``get_batch`` returns Nones there); the
        first chunk with encoders merges their outputs into its tokens: it needs them."""
        if not self.batches.has_data and not (c == 0 and self.x.encoders):
            return None
        return iter([self.batch(m, f"F({m}, {c}) merges the encoders' outputs")])

    def encoder_output(self, m: int, last: int) -> Optional[torch.Tensor]:
        """Encoder piece ``last``'s output (an encoder's last piece) for ``F(m, 0)``, a
        leaf of its graph; with replicas, from the owner replica to the whole LLM TP
        group."""
        if self.replicas is None:
            return self.receive(self.rank_of("EF", m, last), ("EF", m, last), self.trains(last))
        out = self.local.pop((Kind.BCAST, m, last))  # BCAST(m, last) ran just before
        if out is not None:  # only the owner's EB takes its gradient
            out = out.detach().requires_grad_(self.trains(last) and self.runs_encoder(m)
                                               and out.is_floating_point())
        return out

    def run_BCAST(self, m: int, p: int) -> None:
        """Encoder piece ``p``'s output from the owner replica to the LLM TP group."""
        out = (self.receive(self.rank_of("EF", m, p), ("EF", m, p), False)
               if self.runs_encoder(m) else None)
        self.local[(Kind.BCAST, m, p)] = self.replicas.share_output(
            m, out, self.spec(("EF", m, p)), self.mailbox.device)

    def run_ALLREDUCE(self, m: int, rank: int) -> None:
        """This rank's encoder pieces' gradients summed over the replicas."""
        if self.encoder_trainable:
            self.replicas.reduce_grads([
                p for chunk in self.model
                for p in get_attr_wrapped_model(chunk, "encoder_piece_parameters")()])

    def run_GRAD_SYNC(self, m: int, c: int) -> None:
        """Nothing here: ``_OverlappedGradSync.after`` starts chunk ``c``'s reduction right
        after this action (with --overlap-grad-reduce; else finalisation reduces)."""

    def run_A2A(self, m: int, c: int) -> None:
        """Nothing here: chunk ``c``'s MoE layers ran their expert all-to-alls inside
        ``F(m, c)`` (Megatron-Core's token dispatcher); every rank of the expert-parallel
        group runs the same order, so they meet in each in turn."""

    run_A2A_B = run_A2A  # ... inside ``B(m, c)``

    def run_B(self, m: int, c: int) -> None:
        inputs, output = self.saved.pop(("F", m, c))
        last = c == self.s.num_chunks - 1
        grad = None if last else self.receive(self.rank_of("B", m, c + 1), ("B", m, c + 1), False)
        if isinstance(inputs, list):  # a frozen encoder's output: no gradient to hand back
            inputs = [x if x is not None and x.requires_grad else None for x in inputs]
        if output.requires_grad:
            input_grad = backward_step(inputs, output, grad, self.config)
        else:  # nothing trainable upstream of the loss (Megatron's backward_step skips too)
            input_grad = [None] * len(inputs) if isinstance(inputs, list) else None
        if c > 0:
            self.send(self.rank_of("B", m, c - 1), ("B", m, c), input_grad)
        elif self.runs_encoder(m):  # other replicas' own EB
            if input_grad:
                input_grad = self.x.encoder_output_grads(inputs, input_grad)
            for (_, end), g in zip(self.s.encoder_spans(), input_grad or ()):
                if self.trains(end - 1):
                    self.send(self.rank_of("EB", m, end - 1), output_grad_key(m, end - 1), g)

    def run_EB(self, m: int, p: int) -> None:
        hidden, out = self.saved.pop(("EF", m, p))
        first, end = self.s.encoder_span(p)
        grad = (self.receive(self.rank_of("B", m, 0), output_grad_key(m, p), False) if p == end - 1
                else self.receive(self.rank_of("EB", m, p + 1), ("EB", m, p + 1), False))
        input_grad = None
        if ("EF", m, p) in self.idle:
            self.idle.remove(("EF", m, p))
            grad = torch.zeros_like(out)
        if out is not None and out.requires_grad and grad is not None:
            input_grad = backward_step(hidden, out, grad, self.config)
        if p > first:
            self.send(self.rank_of("EB", m, p - 1), ("EB", m, p), input_grad)


class _OverlappedGradSync:
    """``--overlap-grad-reduce``: each model chunk's data-parallel gradient reduction starts
    (asynchronously, Megatron-Core DDP's ``start_grad_sync``) right after the last action
    that adds to its gradients, so it runs under the rest of the schedule (the encoder's
    backward pieces, say); ``finalize_model_grads`` then waits for it. Until then the
    chunk's backward hooks stay quiet (its ``no_sync``): gradients accumulate over
    micro-batches, and no bucket starts while a later action still adds to it. The start
    points are the schedule's ``GRAD_SYNC`` actions; a schedule without them: after the
    last ``B`` / ``EB`` (encoder pieces live in the first chunk; with encoder replicas that
    chunk starts only at the end, after their sum)."""

    def __init__(self, it: "_Iteration", actions: List[Action]):
        self.chunks = it.model
        # Megatron-LM's --save-wgrads-interval iterations: an all-reduce in place of the
        # distributed optimizer's reduce-scatter, from the first bucket on (DDP's own
        # start_grad_sync takes no such argument; its backward hooks pass the chunk's)
        self.force_all_reduce = it.call.force_all_reduce
        no_sync = it.config.no_sync_func
        self.start_at: Dict[int, int] = {}
        if it.forward_only or no_sync is None:
            return
        pp = it.s.pipeline_model_parallel_size
        end = len(actions)
        self.start_at = {k: -1 for k in range(len(self.chunks))}
        for i, a in enumerate(actions):
            if a.kind in ("B", "EB"):
                self.start_at[a.chunk // pp if a.kind == "B" else 0] = i
        for k, i in self.start_at.items():
            if i < 0 or (k == 0 and it.replicas is not None):
                self.start_at[k] = end
        if any(a.kind == Kind.GRAD_SYNC for a in actions):
            self.start_at = {a.chunk // pp: i for i, a in enumerate(actions)
                             if a.kind == Kind.GRAD_SYNC}
        funcs = no_sync if isinstance(no_sync, list) else [no_sync]
        self.quiet = [f() for f in funcs]
        for context in self.quiet:
            context.__enter__()

    def after(self, index: int) -> None:
        """Start the reduction of every chunk whose gradients are final after action
        ``index`` (``len(actions)``: after the replicas' sum)."""
        for k, i in self.start_at.items():
            if i == index:
                self.quiet[k].__exit__(None, None, None)
                _start_grad_sync(self.chunks[k], self.force_all_reduce)


def _start_grad_sync(chunk, force_all_reduce: bool) -> None:
    """DDP's ``start_grad_sync``, with ``force_all_reduce`` handed to each bucket group
    as its backward hook hands it (``register_grad_ready``)."""
    groups = getattr(chunk, "bucket_groups", None)
    if not force_all_reduce or groups is None:
        chunk.start_grad_sync()
        return
    for group in groups + getattr(chunk, "expert_parallel_bucket_groups", []):
        group.start_grad_sync(force_all_reduce=True)


class _ParamSync:
    """``--overlap-param-gather`` with aligned gathers (Megatron-LM sets
    ``config.param_sync_func``, each chunk's DDP ``start_param_sync``, where
    ``align_param_gather`` holds: VPP): DDP's forward pre-hooks then only wait for the
    gathers (they dispatch none ahead), so the schedule dispatches them, as Megatron-Core's
    interleaved schedule does: the first two model chunks' before the first action, each
    later chunk's at the first forward of the chunk before it (so it runs under that
    chunk's work), always before its own first use. Once per chunk and training call
    (a second dispatch while one is in flight is DDP's assertion); none in forward-only
    calls (Megatron-Core clears the function there; the hooks gather)."""

    def __init__(self, it: "_Iteration", actions: List[Action]):
        self.at: Dict[int, List[int]] = {}  # action index -> model chunks dispatched there
        funcs = it.config.param_sync_func
        if funcs is None or it.forward_only:
            return
        chunks = it.model
        funcs = funcs if isinstance(funcs, list) else [funcs] * len(chunks)
        pp = it.s.pipeline_model_parallel_size
        first_use: Dict[int, int] = {}
        for i, a in enumerate(actions):
            if it.x.owns(a) and a.kind in (Kind.F, Kind.EF, Kind.B, Kind.EB):
                first_use.setdefault(a.chunk // pp if a.kind in (Kind.F, Kind.B) else 0, i)
        for k in range(len(chunks)):
            due = 0 if k < 2 else first_use.get(k - 1, 0)
            due = min(due, first_use.get(k, len(actions)))
            self.at.setdefault(due, []).append(k)
        self.run = [(lambda f=f, c=c: f(c.parameters())) for f, c in zip(funcs, chunks)]

    def before(self, index: int) -> None:
        for k in self.at.get(index, ()):
            self.run[k]()


class _EmbeddingWgrad:
    """``defer_embedding_wgrad_compute`` (``--defer-embedding-wgrad-compute``): the output
    layer keeps each micro-batch's input (``embedding_activation_buffer``) and output
    gradient (``grad_output_buffer``) and skips its weight-gradient GEMM; on the rank
    holding the LLM's last chunk Megatron-Core's ``drain_embedding_wgrad_compute`` runs
    those GEMMs during the pipeline's flush. Here: right after that chunk's last backward
    (before its reduction starts under --overlap-grad-reduce), as Megatron-Core's
    schedules do before ``finalize_model_grads``. Both buffers start each call empty (a
    forward-only call's inputs are dropped at its end: no backward will read them)."""

    def __init__(self, it: "_Iteration", actions: List[Action]):
        self.lm, self.at = None, -1
        if not getattr(it.config, "defer_embedding_wgrad_compute", False):
            return
        self.config = it.config
        pp = it.s.pipeline_model_parallel_size
        last = it.s.num_chunks - 1
        if last // pp >= len(it.model) or it.s.rank_of(Action(Kind.F, 0, last)) != it.rank:
            return  # the output layer is on another rank
        self.lm = _language_model(it.model[last // pp])
        self.lm.embedding_activation_buffer.clear()
        self.lm.grad_output_buffer.clear()
        if it.forward_only:
            self.at = len(actions)
            return
        self.at = max((i for i, a in enumerate(actions) if a.kind == Kind.B and a.chunk == last),
                      default=len(actions))

    def after(self, index: int) -> None:
        if index != self.at:
            return
        inputs, grads = self.lm.embedding_activation_buffer, self.lm.grad_output_buffer
        if grads:  # Megatron-Core's finish_embedding_wgrad_compute, its weight choice
            lm = self.lm
            weight = (lm.output_layer.weight if lm.share_embeddings_and_output_weights
                      else lm.shared_embedding_or_output_weight())
            drain_embedding_wgrad_compute(self.config, inputs, grads, weight,
                                          lm.output_layer.tp_group)
        inputs.clear()  # a forward-only call's (no gradients came)
        grads.clear()


def _language_model(chunk):
    """The module holding the output layer's deferral buffers (Megatron-Core's GPTModel,
    inside MultimodalModel when the chunk is one)."""
    try:
        return get_attr_wrapped_model(chunk, "language_model")
    except RuntimeError:
        return get_attr_wrapped_model(chunk, "embedding_activation_buffer",
                                      return_model_obj=True)


def _device_of(module) -> torch.device:
    return next(module.parameters()).device
