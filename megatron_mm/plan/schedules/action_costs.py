"""Per-action costs (``simulate.ActionCosts``) of an MLLM from the cost model, for the
Megatron baseline and for an Optimus encoder plan.

Per micro-batch (``--micro-batch-size`` samples of ``--seq-length`` tokens, each with the
encoder's media items):

- LLM chunk: its decoder layers (Megatron's uniform layout, num_layers / (PP x VPP) each,
  the first chunks one more where they do not divide; the output layer and loss on the
  last chunk), FLOPs / TP on ``Hardware``, plus TP's
  exposed communication: 2 all-reduces of the layer's activations per layer forward,
  2 per backward, 2 more for the recompute forward (Megatron without comm overlap);
- encoder piece: consecutive encoder layers (the patch stem on the first piece, the
  projector on the last), FLOPs / TP_enc plus TP_enc's all-reduces; with ``sublayer``
  pieces (Optimus' kernel-level granularity) each layer is two units, its attention and
  its MLP (one all-reduce each), and pieces are cut at any unit boundary. The m = TP / TP_enc
  encoder pipelines that share one LLM rank's GPUs take turns with the micro-batches, so one
  lane per rank carries 1 / m of each encoder micro-batch's time (an even split of the
  micro-batches among identical co-located pipelines, Optimus' best composition);
- TP bubbles: the LLM layers' all-reduces (compute idle) are ``forward_comm_s`` /
  ``backward_comm_s``, where the planner's bubble schedule runs small encoder pieces
  (Optimus' fine-grained TP-bubble filling); their own TP all-reduces
  (``encoder_*_comm_s``) share the links with the LLM's, so the rank pays for them once
  more there;
- a frozen encoder runs forwards only (its trainable projector's backward, a small
  matmul, is left out of both the baseline and the plans);
- an MoE LLM (``TransformerSpec.is_moe``): its layers' active FLOPs (router, top-k experts,
  shared experts; dense layers their own MLP), each chunk's expert all-to-alls over
  ``--expert-model-parallel-size`` EP (``all_to_all_s``: 2 per MoE layer forward, as many
  per backward and again for the recompute; bytes ``flops.all_to_all_bytes`` / TP, over
  NVLink when ETP x EP fits in a node); the experts' parameters split over ETP x EP;
- Megatron baseline: the whole encoder at the LLM's TP inside LLM chunk 0 (the first
  stage), as Megatron-LM places encoders in the first stage's pre-process;
- data-parallel traffic (distributed optimizer with MegaScale's / Megatron's overlap of
  the parameter all-gather and gradient reduce-scatter with compute, as in Optimus' runs):
  the first model chunk's bf16 all-gather stays exposed before the LLM starts (1 / VPP of
  the rank's LLM parameters over DP, plus its encoder stage over DP_enc); each chunk's
  fp32 reduce-scatter is the schedule's ``GRAD_SYNC`` of that chunk (``reduce_s``), run on
  the communication stream once the chunk's last backward is done, and the encoder
  stage's over DP_enc its own ``ENCODER_GRAD_SYNC`` (``encoder_reduce_s``: Optimus' encoder
  has its own data-parallel group, so its reduction is its own collective), so the
  simulator shows which of them the compute hides;
- encoder replicas (TP_enc < TP: m = TP / TP_enc per LLM TP group): each micro-batch's
  encoder output is broadcast over the LLM TP group (``BCAST``, the encoder's output
  activation), and the replicas' fp32 gradients are all-reduced once per iteration
  (``ALLREDUCE``) before the data-parallel reduction over the remaining DP_enc / m.

Memory per GPU follows Optimus (section 4.5): 6 bytes per parameter (bf16 weight, fp32
gradient) plus 12 / DP (fp32 master weight and Adam moments, sharded by the distributed
optimizer), plus activations: LLM layers keep their input per in-flight micro-batch with
full recompute (all of it without), and the encoder keeps its layer inputs for every
micro-batch whose backward has not run (all of them at worst: coarse runs every forward
first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..costs import flops
from ..costs.hardware import Hardware, Interconnect
from ..costs.unit_costs import TimeModel, UnitSeconds
from ..errors import PlanError
from ..model import EncoderSpec, ModelSpec
from ..pipeline.inflight import inflight_microbatches
from ..record import Record
from .generate import EncoderLayout
from .simulate import ActionCosts


@dataclass
class LLMLayout(Record):
    """The LLM's plan and batch (Megatron flag names)."""

    pipeline_model_parallel_size: int
    tensor_model_parallel_size: int
    data_parallel_size: int
    virtual_pipeline_model_parallel_size: int = 1
    micro_batch_size: int = 1
    global_batch_size: int = 1
    seq_length: int = 2048
    recompute: bool = True  # --recompute-granularity full
    expert_model_parallel_size: int = 1  # an MoE LLM's experts over EP ranks
    expert_tensor_parallel_size: Optional[int] = None  # TP inside each expert; None: TP

    def __post_init__(self):
        tp, ep = self.tensor_model_parallel_size, self.expert_model_parallel_size
        etp = self.expert_tensor_parallel_size = self.expert_tensor_parallel_size or tp
        if (tp * self.data_parallel_size) % (etp * ep):
            raise PlanError(f"--expert-tensor-parallel-size ({etp}) x "
                            f"--expert-model-parallel-size ({ep}) must divide TP x DP "
                            f"({tp} x {self.data_parallel_size}): Megatron-Core's expert grid")
        per_step = self.data_parallel_size * self.micro_batch_size
        if self.global_batch_size % per_step:
            raise PlanError(f"--global-batch-size ({self.global_batch_size}) must be a "
                            f"multiple of data-parallel size x --micro-batch-size ({per_step})")
        pp, vpp = self.pipeline_model_parallel_size, self.virtual_pipeline_model_parallel_size
        if vpp > 1 and self.num_microbatches % pp:
            raise PlanError(f"interleaved 1F1B needs the micro-batches "
                            f"({self.num_microbatches}) to be a multiple of "
                            f"--pipeline-model-parallel-size ({pp})")

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.data_parallel_size * self.micro_batch_size)

    @property
    def num_chunks(self) -> int:
        return self.pipeline_model_parallel_size * self.virtual_pipeline_model_parallel_size


@dataclass
class EncoderPlan(Record):
    """Optimus' encoder plan: PP_enc divides PP, TP_enc divides TP, and
    DP_enc = DP x (PP / PP_enc) x (TP / TP_enc), so every GPU holds encoder state."""

    encoder_pipeline_model_parallel_size: int
    encoder_tensor_model_parallel_size: int
    encoder_data_parallel_size: int

    @classmethod
    def of(cls, layout: LLMLayout, pp_enc: int, tp_enc: int) -> "EncoderPlan":
        pp, tp = layout.pipeline_model_parallel_size, layout.tensor_model_parallel_size
        if pp % pp_enc or tp % tp_enc:
            raise PlanError(f"encoder PP {pp_enc} / TP {tp_enc} must divide the LLM's PP "
                            f"{pp} / TP {tp}")
        return cls(pp_enc, tp_enc, layout.data_parallel_size * (pp // pp_enc) * (tp // tp_enc))


class _EncoderFlops:
    """One encoder's per-micro-batch costs (its layers, their kernels, stem, projector)."""

    def __init__(self, enc: EncoderSpec, model: ModelSpec, layout: LLMLayout):
        self.spec = enc
        self.trainable = enc.name not in model.frozen_encoders
        seqs = layout.micro_batch_size * enc.items_per_sample
        self.layer = flops.transformer_layer(enc.transformer, seqs, enc.tokens_per_item,
                                             causal=False, spans=enc.attention_spans)
        self.sublayers = flops.transformer_sublayers(enc.transformer, seqs,
                                                     enc.tokens_per_item, causal=False,
                                                     spans=enc.attention_spans)
        self.embed = flops.encoder_embed(enc, seqs)
        self.projector = flops.projector(enc, model.llm.hidden_size, seqs)
        self.act_bytes = flops.BF16 * seqs * enc.tokens_per_item * enc.transformer.hidden_size

    @property
    def params(self) -> float:
        return (self.spec.transformer.num_layers * self.layer.params + self.embed.params
                + self.projector.params)


class CostModel:
    """Seconds and bytes of one model on one cluster; cached per-layer numbers. Several
    encoders (vision and audio) each get their own pipeline layout; encoder 0 is the one
    ``EncoderPlan`` places, the others are given by ``EncoderLayout``s; all share the
    encoder TP."""

    def __init__(self, model: ModelSpec, layout: LLMLayout, hardware: Hardware,
                 links: Interconnect):
        if not model.encoders:
            raise PlanError("the Optimus planner schedules encoders; this model has none")
        self.model, self.layout, self.hw, self.links = model, layout, hardware, links
        self.time = TimeModel(hardware, links)  # the one time model (unit_costs)
        self.encoders = [_EncoderFlops(enc, model, layout) for enc in model.encoders]
        self.enc: EncoderSpec = model.encoders[0]
        self.encoder_trainable = any(e.trainable for e in self.encoders)
        self.frozen_encoders = [i for i, e in enumerate(self.encoders) if not e.trainable]
        b, s = layout.micro_batch_size, layout.seq_length
        llm = model.llm
        # one layer's all-reduce bytes (the TP bubbles; every layer kind has two)
        self.llm_layer = flops.transformer_layer(llm, b, s, causal=True)
        # per LLM layer: its costs (MoE or dense) and one expert all-to-all's seconds
        self.llm_layers = [flops.llm_layer(llm, i, b, s)  # a hybrid's layers differ
                           for i in range(llm.num_layers)]
        tp, ep = layout.tensor_model_parallel_size, layout.expert_model_parallel_size
        span = layout.expert_tensor_parallel_size * ep
        self.all_to_all = [links.all_to_all_seconds(
            flops.all_to_all_bytes(llm, b * s, ep) / tp, span) if llm.is_moe(i) else 0.0
            for i in range(llm.num_layers)]
        if layout.num_chunks > llm.num_layers:
            raise PlanError(f"{llm.num_layers} LLM layers cannot fill PP x VPP = "
                            f"{layout.num_chunks} chunks")
        counts = [llm.num_layers // layout.num_chunks + (c < llm.num_layers % layout.num_chunks)
                  for c in range(layout.num_chunks)]
        ends = [sum(counts[:c + 1]) for c in range(len(counts))]
        self.chunk_spans = list(zip([0] + ends[:-1], ends))  # LLM layers [start, end)
        self.expert_params = [flops.expert_params(llm) if llm.is_moe(i) else 0.0
                              for i in range(llm.num_layers)]
        self.llm_head = flops.llm_head(llm, b * s)
        self.llm_embed = flops.llm_embed(llm, b * s)
        self.llm_act_bytes = flops.BF16 * b * s * llm.hidden_size

    # -- time ---------------------------------------------------------------------------
    def _layer_s(self, cost: flops.Cost, tp: int, act_bytes: float, trainable: bool,
                 allreduces: int = 2) -> Tuple[float, float]:
        """(forward, backward) seconds of a transformer layer (``allreduces`` 2) or one of
        its two kernels (1) at ``tp`` (``unit_costs.TimeModel``)."""
        u = self._unit(cost, tp, act_bytes, trainable, allreduces)
        return u.forward_s, u.backward_s

    def _unit(self, cost: flops.Cost, tp: int, act_bytes: float, trainable: bool,
              allreduces: int) -> UnitSeconds:
        rec = self.layout.recompute
        return self.time.unit(cost.fwd, cost.dgrad + cost.wgrad + (cost.fwd if rec else 0.0),
                              tp, act_bytes, allreduces, rec, trainable)

    def _plain_s(self, cost: flops.Cost, tp: int, trainable: bool) -> Tuple[float, float]:
        u = self.time.unit(cost.fwd, cost.dgrad + cost.wgrad, tp, backward=trainable)
        return u.forward_s, u.backward_s

    def llm_chunks(self, spans: Optional[Sequence[Tuple[int, int]]] = None
                   ) -> Tuple[List[float], List[float]]:
        """(forward, backward) seconds of each LLM chunk: ``spans`` of LLM layers
        [start, end) (default ``chunk_spans``, Megatron's uniform layout); the output layer
        on the span that ends with the last layer."""
        lay = self.layout
        last = self.model.llm.num_layers
        units = [self._layer_s(layer, lay.tensor_model_parallel_size, self.llm_act_bytes,
                               not self.model.freeze_llm) for layer in self.llm_layers]
        hf, hb = self._plain_s(self.llm_head, lay.tensor_model_parallel_size,
                               not self.model.freeze_llm)
        spans = self.chunk_spans if spans is None else spans
        fwd = [sum(u[0] for u in units[s:e]) + (hf if e == last else 0.0) for s, e in spans]
        bwd = [sum(u[1] for u in units[s:e]) + (hb if e == last else 0.0) for s, e in spans]
        return fwd, bwd

    def llm_all_to_alls(self) -> Tuple[List[float], List[float]]:
        """(forward, backward) seconds of each LLM chunk's expert all-to-alls (empty
        without any): dispatch and combine per MoE layer, the backward's as many, and
        the recompute forward's."""
        if not any(self.all_to_all):
            return [], []
        back = 0 if self.model.freeze_llm else (4 if self.layout.recompute else 2)
        chunks = [sum(self.all_to_all[s:e]) for s, e in self.chunk_spans]
        return [2 * a for a in chunks], [back * a for a in chunks]

    def expert_chunks(self) -> List[int]:
        """The LLM chunks whose MoE layers run expert all-to-alls."""
        return [c for c, (s, e) in enumerate(self.chunk_spans) if any(self.all_to_all[s:e])]

    def llm_tp_bubbles(self) -> Tuple[List[float], List[float]]:
        """(forward, backward) seconds per LLM chunk spent in its layers' TP all-reduces,
        compute idle: Optimus' TP bubbles."""
        lay = self.layout
        u = self._unit(self.llm_layer, lay.tensor_model_parallel_size, self.llm_act_bytes,
                       not self.model.freeze_llm, 2)
        return ([(e - s) * u.forward_comm_s for s, e in self.chunk_spans],
                [(e - s) * u.backward_comm_s for s, e in self.chunk_spans])

    def encoder_units(self, tp_enc: int, sublayer: bool = False, e: int = 0
                      ) -> List[Tuple[float, float, float, float, float]]:
        """(forward s, backward s, parameters per GPU, forward and backward s of its TP
        all-reduces) of each unit a piece of encoder ``e`` is cut from, in order: its
        layers, or their attention and MLP kernels (``sublayer``)."""
        enc = self.encoders[e]
        t, layers = enc.trainable, enc.spec.transformer.num_layers
        kernels = [(enc.layer, 2)] if not sublayer else [(k, 1) for k in enc.sublayers]
        units = []
        for kernel, allreduces in kernels:
            u = self._unit(kernel, tp_enc, enc.act_bytes, t, allreduces)
            units.append((u.forward_s, u.backward_s, kernel.params / tp_enc, u.forward_comm_s,
                          u.backward_comm_s))
        return units * layers

    def encoder_pieces(self, tp_enc: int, n: int, share: float = 1.0,
                       sublayer: bool = False, e: int = 0) -> Tuple[List[float], ...]:
        """(forward, backward seconds, parameters per GPU, forward and backward seconds
        of the TP all-reduces) of encoder ``e`` cut into ``n`` pieces of consecutive units
        (``encoder_units``), at ``tp_enc``; seconds times ``share`` (the lane's part of
        each micro-batch)."""
        units = self.encoder_units(tp_enc, sublayer, e)
        if n > len(units):
            raise PlanError(f"cannot cut encoder {self.encoders[e].spec.name!r}'s "
                            f"{len(units)} {'kernels' if sublayer else 'layers'} into {n} "
                            "pieces")
        enc = self.encoders[e]
        t = enc.trainable
        ef, eb = self._plain_s(enc.embed, tp_enc, t)
        pf, pb = self._plain_s(enc.projector, tp_enc, t)
        fwd, bwd, params, fwd_comm, bwd_comm = [], [], [], [], []
        for i in range(n):
            mine = units[i * len(units) // n:(i + 1) * len(units) // n]
            fwd_comm.append(share * sum(u[3] for u in mine))
            bwd_comm.append(share * sum(u[4] for u in mine))
            first, last = i == 0, i == n - 1
            fwd.append(share * (sum(u[0] for u in mine) + (ef if first else 0.0)
                                + (pf if last else 0.0)))
            bwd.append(share * (sum(u[1] for u in mine) + (eb if first else 0.0)
                                + (pb if last else 0.0)))
            params.append(sum(u[2] for u in mine)
                          + ((enc.embed.params if first else 0.0)
                             + (enc.projector.params if last else 0.0)) / tp_enc)
        return fwd, bwd, params, fwd_comm, bwd_comm

    def p2p_s(self) -> float:
        # Megatron sends 1 / TP of the activation per GPU (scatter-gather optimisation)
        return self.time.p2p_s(self.llm_act_bytes / self.layout.tensor_model_parallel_size)

    # -- parameters and the data-parallel bubbles -----------------------------------------
    def llm_params_per_gpu(self) -> float:
        lay = self.layout
        layers = self._layer_params(0, self.model.llm.num_layers)
        ends = self.llm_embed.params + self.llm_head.params  # on the first and last stage
        return (layers / lay.pipeline_model_parallel_size
                + ends / min(2, lay.pipeline_model_parallel_size)) / lay.tensor_model_parallel_size

    def _layer_params(self, start: int, end: int) -> float:
        """Parameters of LLM layers [start, end), x TP per GPU: the experts split over
        ETP x EP."""
        lay = self.layout
        split = (lay.tensor_model_parallel_size / lay.expert_tensor_parallel_size
                 / lay.expert_model_parallel_size)
        return sum(l.params - x + x * split for l, x in zip(self.llm_layers[start:end],
                                                            self.expert_params[start:end]))

    def encoder_params(self, e: int = 0) -> float:
        return self.encoders[e].params

    def llm_chunk_params(self) -> List[float]:
        """Parameters per GPU of each LLM chunk (the word embedding on chunk 0, the output
        layer on the last)."""
        lay = self.layout
        chunks = lay.num_chunks
        return [(self._layer_params(*self.chunk_spans[c])
                 + (self.llm_embed.params if c == 0 else 0.0)
                 + (self.llm_head.params if c == chunks - 1 else 0.0))
                / lay.tensor_model_parallel_size for c in range(chunks)]

    def dp_gather_s(self, encoders: Sequence[Tuple[int, float, int]]) -> float:
        """The all-gather before the LLM starts, seconds: the LLM's first chunk, and each
        trained encoder's (index, parameters per GPU, its data-parallel size)."""
        dp = self.layout.data_parallel_size
        llm = self.llm_params_per_gpu() / self.layout.virtual_pipeline_model_parallel_size
        return self.links.dp_seconds(flops.BF16 * llm, dp) + sum(
            self.links.dp_seconds(flops.BF16 * p, d) for e, p, d in encoders
            if self.encoders[e].trainable)

    def reduce_s(self) -> List[float]:
        """Each LLM chunk's data-parallel gradient reduce-scatter over DP, seconds (none
        for a frozen LLM)."""
        lay = self.layout
        dp = lay.data_parallel_size
        # the experts' gradients over the expert-data-parallel group, TP x DP / (ETP x EP)
        edp = (lay.tensor_model_parallel_size * dp // lay.expert_tensor_parallel_size
               // lay.expert_model_parallel_size)
        experts = [sum(self.expert_params[s:e]) / lay.expert_tensor_parallel_size
                   / lay.expert_model_parallel_size for s, e in self.chunk_spans]
        return [0.0 if self.model.freeze_llm else
                self.links.dp_seconds(flops.FP32 * (p - x), dp)
                + self.links.dp_seconds(flops.FP32 * x, edp)
                for p, x in zip(self.llm_chunk_params(), experts)]

    def encoder_reduce_s(self, params_per_gpu: List[float], dp_enc: int, e: int = 0
                         ) -> List[float]:
        """Each piece of encoder ``e``: its gradient reduce-scatter over ``dp_enc``,
        seconds."""
        return [self.links.dp_seconds(flops.FP32 * p, dp_enc) if self.encoders[e].trainable
                else 0.0 for p in params_per_gpu]

    # -- the two kinds of costs -------------------------------------------------------------
    def baseline(self) -> ActionCosts:
        """Megatron: every encoder whole at the LLM's TP inside chunk 0."""
        tp, dp = self.layout.tensor_model_parallel_size, self.layout.data_parallel_size
        fwd, bwd = self.llm_chunks()
        reduce = self.reduce_s()
        for e in range(len(self.encoders)):
            ef, eb, params, _, _ = self.encoder_pieces(tp, 1, e=e)
            fwd[0] += ef[0]
            bwd[0] += eb[0]
            reduce[0] += self.encoder_reduce_s(params, dp, e)[0]  # part of chunk 0
        gather = self.dp_gather_s([(e, self.encoder_params(e) / tp, dp)
                                   for e in range(len(self.encoders))])
        a2a_f, a2a_b = self.llm_all_to_alls()
        return ActionCosts(fwd, bwd, p2p_s=self.p2p_s(), llm_start_s=gather, reduce_s=reduce,
                           all_to_all_s=a2a_f, backward_all_to_all_s=a2a_b)

    def optimus(self, plan: EncoderPlan, pieces: int, sublayer: bool = False,
                reverse: bool = False, others: Sequence[EncoderLayout] = ()) -> ActionCosts:
        """Encoder 0 as its own pipeline of ``PP_enc x pieces`` pieces (of layers, or of
        attention / MLP kernels with ``sublayer``), each other encoder by its own layout
        (``others``: one per encoder after the first; default encoder 0's), all at the
        plan's encoder TP; their pieces one encoder after the other."""
        pp_enc, tp_enc = (plan.encoder_pipeline_model_parallel_size,
                          plan.encoder_tensor_model_parallel_size)
        tp, pp = self.layout.tensor_model_parallel_size, self.layout.pipeline_model_parallel_size
        dp = self.layout.data_parallel_size
        replicas = tp // tp_enc
        if len(others) not in (0, len(self.encoders) - 1):
            raise PlanError(f"{len(others)} layouts for the {len(self.encoders) - 1} encoders "
                            "after the first")
        layouts = [(EncoderLayout(pp_enc, pieces, reverse), sublayer)] + [
            (o, False) for o in (others or [EncoderLayout(pp_enc, pieces, reverse)]
                                 * (len(self.encoders) - 1))]
        fwd, bwd = self.llm_chunks()
        ef, eb, enc_reduce, bcast, gathers, efc, ebc = [], [], [], [], [], [], []
        allreduce = [0.0] * pp
        for e, (lay, sub) in enumerate(layouts):
            stages = lay.encoder_pipeline_model_parallel_size
            ranks = lay.ranks(pp)
            f, b, params, fc, bc = self.encoder_pieces(tp_enc, len(ranks), 1.0 / replicas,
                                                       sub, e)
            dp_enc = dp * (pp // stages) * replicas
            trainable = self.encoders[e].trainable
            efc += fc
            ebc += bc if trainable else [0.0] * len(bc)
            ef += f
            eb += b if trainable else [0.0] * len(b)
            enc_reduce += self.encoder_reduce_s(params, dp_enc // replicas, e)
            bcast += [0.0] * (len(ranks) - 1) + [self.time.broadcast_s(
                self.encoders[e].act_bytes, tp) if replicas > 1 else 0.0]
            gathers.append((e, self.encoder_params(e) / (stages * tp_enc), dp_enc))
            if replicas > 1 and trainable:
                for r in set(ranks):
                    allreduce[r] += self.time.replica_allreduce_s(
                        sum(p for p, q in zip(params, ranks) if q == r), replicas)
        fwd_comm, bwd_comm = self.llm_tp_bubbles()
        a2a_f, a2a_b = self.llm_all_to_alls()
        costs = ActionCosts(fwd, bwd, ef, eb if self.encoder_trainable else [],
                            all_to_all_s=a2a_f, backward_all_to_all_s=a2a_b,
                            p2p_s=self.p2p_s(), llm_start_s=self.dp_gather_s(gathers),
                            reduce_s=self.reduce_s(), encoder_reduce_s=enc_reduce,
                            forward_comm_s=fwd_comm, backward_comm_s=bwd_comm,
                            encoder_forward_comm_s=efc,
                            encoder_backward_comm_s=ebc if self.encoder_trainable else [])
        if replicas > 1:
            costs.broadcast_s, costs.replica_allreduce_s = bcast, allreduce
        return costs

    # -- memory ---------------------------------------------------------------------------
    def memory_bytes(self, plan: Optional[EncoderPlan]) -> float:
        """Peak bytes on the fullest GPU (rank 0: the most in-flight micro-batches)."""
        lay = self.layout
        pp, tp, vpp, m = (lay.pipeline_model_parallel_size, lay.tensor_model_parallel_size,
                          lay.virtual_pipeline_model_parallel_size, lay.num_microbatches)

        def states(params: float, dp: int, trainable: bool) -> float:
            return params * ((6.0 + 12.0 / dp) if trainable else 2.0)

        llm_p = self.llm_params_per_gpu()
        total = states(llm_p, lay.data_parallel_size, not self.model.freeze_llm)
        held = sum(inflight_microbatches(pp, vpp, 0, m))
        # per chunk what its layers keep (a hybrid's Gated DeltaNet and attention layers
        # keep different bytes); the fullest chunk's, and one layer's working set
        kept = max((e - s) * self.llm_act_bytes if lay.recompute
                   else sum(layer.act for layer in self.llm_layers[s:e])
                   for s, e in self.chunk_spans)
        working = max(layer.act for layer in self.llm_layers)
        total += held * kept / tp + working / tp
        for enc in self.encoders:  # every encoder at the plan's layout: a GPU may hold all
            layers = enc.spec.transformer.num_layers
            if plan is None:  # baseline: the encoder on rank 0 at the LLM's TP, in chunk 0
                enc_p, enc_tp, dp_enc = enc.params / tp, tp, lay.data_parallel_size
                enc_layers, enc_held = layers, inflight_microbatches(pp, vpp, 0, m)[0]
            else:
                pp_enc = plan.encoder_pipeline_model_parallel_size
                enc_tp = plan.encoder_tensor_model_parallel_size
                enc_p = enc.params / (pp_enc * enc_tp)
                dp_enc, enc_layers = plan.encoder_data_parallel_size, math.ceil(layers / pp_enc)
                enc_held = math.ceil(m * enc_tp / tp)  # this GPU's pipeline's micro-batches
            total += states(enc_p, dp_enc, enc.trainable)
            if enc.trainable:
                kept = enc.act_bytes / enc_tp if lay.recompute else enc.layer.act / enc_tp
                total += enc_held * enc_layers * kept + enc.layer.act / enc_tp
        return total
