"""Per-action costs (``simulate.ActionCosts``) of an MLLM from the cost model, for the
Megatron baseline and for an Optimus encoder plan.

Per micro-batch (``--micro-batch-size`` samples of ``--seq-length`` tokens, each with the
encoder's media items):

- LLM chunk: its decoder layers (Megatron's uniform layout, num_layers / (PP x VPP) each;
  the output layer and loss on the last chunk), FLOPs / TP on ``Hardware``, plus TP's
  exposed communication: 2 all-reduces of the layer's activations per layer forward,
  2 per backward, 2 more for the recompute forward (Megatron without comm overlap);
- encoder piece: consecutive encoder layers (the patch stem on the first piece, the
  projector on the last), FLOPs / TP_enc plus TP_enc's all-reduces. The m = TP / TP_enc
  encoder pipelines that share one LLM rank's GPUs take turns with the micro-batches, so one
  lane per rank carries 1 / m of each encoder micro-batch's time (an even split of the
  micro-batches among identical co-located pipelines, Optimus' best composition);
- a frozen encoder runs forwards only (its trainable projector's backward, a small
  matmul, is left out of both the baseline and the plans);
- Megatron baseline: the whole encoder at the LLM's TP inside LLM chunk 0 (the first
  stage), as Megatron-LM places encoders in the first stage's pre-process;
- data-parallel traffic (distributed optimizer with MegaScale's / Megatron's overlap of
  the parameter all-gather and gradient reduce-scatter with compute, as in Optimus' runs):
  the first model chunk's bf16 all-gather stays exposed before the LLM starts (1 / VPP of
  the rank's LLM parameters over DP, plus its encoder stage over DP_enc); each chunk's
  fp32 reduce-scatter is the schedule's ``GRAD_SYNC`` of that chunk (``reduce_s``), run on
  the communication stream once the chunk's last backward is done, the rank's encoder
  stage with its first chunk, so the simulator shows which of them the compute hides;
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
from typing import List, Optional, Tuple

from . import flops
from .errors import PlanError
from .hardware import Hardware, Interconnect
from .model import EncoderSpec, ModelSpec
from .record import Record
from .schedule import inflight_microbatches
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

    def __post_init__(self):
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


class CostModel:
    """Seconds and bytes of one model on one cluster; cached per-layer numbers."""

    def __init__(self, model: ModelSpec, layout: LLMLayout, hardware: Hardware,
                 links: Interconnect):
        if len(model.encoders) != 1:
            raise PlanError("the Optimus planner takes one encoder (several encoders are "
                            "scheduled as one in Optimus; merge them first)")
        self.model, self.layout, self.hw, self.links = model, layout, hardware, links
        self.enc: EncoderSpec = model.encoders[0]
        self.encoder_trainable = self.enc.name not in model.frozen_encoders
        b, s = layout.micro_batch_size, layout.seq_length
        llm = model.llm
        self.llm_layer = flops.transformer_layer(llm, b, s, causal=True)
        self.llm_head = flops.llm_head(llm, b * s)
        self.llm_embed = flops.llm_embed(llm, b * s)
        self.llm_act_bytes = flops.BF16 * b * s * llm.hidden_size
        seqs = b * self.enc.items_per_sample
        self.enc_layer = flops.transformer_layer(self.enc.transformer, seqs,
                                                 self.enc.tokens_per_item, causal=False)
        self.enc_embed = flops.encoder_embed(self.enc, seqs)
        self.enc_projector = flops.projector(self.enc, llm.hidden_size, seqs)
        self.enc_act_bytes = (flops.BF16 * seqs * self.enc.tokens_per_item
                              * self.enc.transformer.hidden_size)

    # -- time ---------------------------------------------------------------------------
    def _layer_s(self, cost: flops.Cost, tp: int, act_bytes: float, trainable: bool
                 ) -> Tuple[float, float]:
        """(forward, backward) seconds of a transformer layer at ``tp``."""
        rec = self.layout.recompute
        ar = self.links.allreduce_seconds(act_bytes, tp)
        fwd = self.hw.seconds(cost.fwd / tp) + 2 * ar
        if not trainable:
            return fwd, 0.0
        bwd_flops = cost.dgrad + cost.wgrad + (cost.fwd if rec else 0.0)
        return fwd, self.hw.seconds(bwd_flops / tp) + (4 if rec else 2) * ar

    def _plain_s(self, cost: flops.Cost, tp: int, trainable: bool) -> Tuple[float, float]:
        return (self.hw.seconds(cost.fwd / tp),
                self.hw.seconds((cost.dgrad + cost.wgrad) / tp) if trainable else 0.0)

    def llm_chunks(self) -> Tuple[List[float], List[float]]:
        lay = self.layout
        chunks, layers = lay.num_chunks, self.model.llm.num_layers
        if layers % chunks:
            raise PlanError(f"{layers} LLM layers do not split evenly over PP x VPP = "
                            f"{chunks} chunks")
        f, b = self._layer_s(self.llm_layer, lay.tensor_model_parallel_size,
                             self.llm_act_bytes, not self.model.freeze_llm)
        hf, hb = self._plain_s(self.llm_head, lay.tensor_model_parallel_size,
                               not self.model.freeze_llm)
        per = layers // chunks
        fwd = [per * f + (hf if c == chunks - 1 else 0.0) for c in range(chunks)]
        bwd = [per * b + (hb if c == chunks - 1 else 0.0) for c in range(chunks)]
        return fwd, bwd

    def encoder_pieces(self, tp_enc: int, n: int, share: float = 1.0
                       ) -> Tuple[List[float], List[float]]:
        """(forward, backward) seconds of the encoder cut into ``n`` pieces of consecutive
        layers, at ``tp_enc``, times ``share`` (the lane's part of each micro-batch)."""
        layers = self.enc.transformer.num_layers
        if n > layers:
            raise PlanError(f"cannot cut {layers} encoder layers into {n} pieces")
        t = self.encoder_trainable
        f, b = self._layer_s(self.enc_layer, tp_enc, self.enc_act_bytes, t)
        ef, eb = self._plain_s(self.enc_embed, tp_enc, t)
        pf, pb = self._plain_s(self.enc_projector, tp_enc, t)
        fwd, bwd = [], []
        for i in range(n):
            count = (i + 1) * layers // n - i * layers // n
            fwd.append(share * (count * f + (ef if i == 0 else 0.0) + (pf if i == n - 1 else 0.0)))
            bwd.append(share * (count * b + (eb if i == 0 else 0.0) + (pb if i == n - 1 else 0.0)))
        return fwd, bwd

    def p2p_s(self) -> float:
        # Megatron sends 1 / TP of the activation per GPU (scatter-gather optimisation)
        return self.links.p2p_seconds(self.llm_act_bytes / self.layout.tensor_model_parallel_size)

    # -- parameters and the data-parallel bubbles -----------------------------------------
    def llm_params_per_gpu(self) -> float:
        lay = self.layout
        layers = self.model.llm.num_layers * self.llm_layer.params
        ends = self.llm_embed.params + self.llm_head.params  # on the first and last stage
        return (layers / lay.pipeline_model_parallel_size
                + ends / min(2, lay.pipeline_model_parallel_size)) / lay.tensor_model_parallel_size

    def encoder_params(self) -> float:
        return (self.enc.transformer.num_layers * self.enc_layer.params
                + self.enc_embed.params + self.enc_projector.params)

    def llm_chunk_params(self) -> List[float]:
        """Parameters per GPU of each LLM chunk (the word embedding on chunk 0, the output
        layer on the last)."""
        lay = self.layout
        chunks = lay.num_chunks
        per = self.model.llm.num_layers // chunks * self.llm_layer.params
        return [(per + (self.llm_embed.params if c == 0 else 0.0)
                 + (self.llm_head.params if c == chunks - 1 else 0.0))
                / lay.tensor_model_parallel_size for c in range(chunks)]

    def dp_gather_s(self, enc_params_per_gpu: float, dp_enc: int) -> float:
        """The all-gather before the LLM starts, seconds."""
        dp = self.layout.data_parallel_size
        llm = self.llm_params_per_gpu() / self.layout.virtual_pipeline_model_parallel_size
        return (self.links.dp_seconds(flops.BF16 * llm, dp)
                + (self.links.dp_seconds(flops.BF16 * enc_params_per_gpu, dp_enc)
                   if self.encoder_trainable else 0.0))

    def reduce_s(self, enc_params_per_gpu: float, dp_enc: int, encoder_ranks: List[int]
                 ) -> List[float]:
        """Each chunk's data-parallel gradient reduce-scatter (``GRAD_SYNC``), seconds: the
        LLM chunk's over DP, plus on the first chunk of each rank in ``encoder_ranks`` its
        encoder stage's over ``dp_enc``. A frozen part reduces nothing."""
        dp = self.layout.data_parallel_size
        llm = [0.0 if self.model.freeze_llm else self.links.dp_seconds(flops.FP32 * p, dp)
               for p in self.llm_chunk_params()]
        if self.encoder_trainable:
            enc = self.links.dp_seconds(flops.FP32 * enc_params_per_gpu, dp_enc)
            for r in set(encoder_ranks):
                llm[r] += enc
        return llm

    # -- the two kinds of costs -------------------------------------------------------------
    def baseline(self) -> ActionCosts:
        """Megatron: the whole encoder at the LLM's TP inside chunk 0."""
        tp = self.layout.tensor_model_parallel_size
        fwd, bwd = self.llm_chunks()
        ef, eb = self.encoder_pieces(tp, 1)
        fwd[0] += ef[0]
        bwd[0] += eb[0]
        enc, dp = self.encoder_params() / tp, self.layout.data_parallel_size
        return ActionCosts(fwd, bwd, p2p_s=self.p2p_s(), llm_start_s=self.dp_gather_s(enc, dp),
                           reduce_s=self.reduce_s(enc, dp, [0]))

    def optimus(self, plan: EncoderPlan, pieces: int, encoder_ranks: List[int]
                ) -> ActionCosts:
        """The encoder as its own pipeline of ``PP_enc x pieces`` pieces on
        ``encoder_ranks`` (one per piece)."""
        pp_enc, tp_enc = (plan.encoder_pipeline_model_parallel_size,
                          plan.encoder_tensor_model_parallel_size)
        tp, pp = self.layout.tensor_model_parallel_size, self.layout.pipeline_model_parallel_size
        replicas = tp // tp_enc
        fwd, bwd = self.llm_chunks()
        ef, eb = self.encoder_pieces(tp_enc, pp_enc * pieces, 1.0 / replicas)
        enc = self.encoder_params() / (pp_enc * tp_enc)
        dp_enc = plan.encoder_data_parallel_size
        costs = ActionCosts(fwd, bwd, ef, eb if self.encoder_trainable else [],
                            p2p_s=self.p2p_s(), llm_start_s=self.dp_gather_s(enc, dp_enc),
                            reduce_s=self.reduce_s(enc, dp_enc // replicas, encoder_ranks))
        if replicas > 1:
            costs.broadcast_s = [self.links.broadcast_seconds(self.enc_act_bytes, tp)
                                 ] * len(ef)
            costs.replica_allreduce_s = [self.links.allreduce_seconds(
                flops.FP32 * enc, replicas) if self.encoder_trainable else 0.0] * pp
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
        per_chunk = self.model.llm.num_layers // lay.num_chunks
        held = sum(inflight_microbatches(pp, vpp, 0, m))
        kept = (self.llm_act_bytes / tp if lay.recompute else self.llm_layer.act / tp)
        total += held * per_chunk * kept + self.llm_layer.act / tp  # + one layer's working set
        layers = self.enc.transformer.num_layers
        if plan is None:  # baseline: the encoder on rank 0 at the LLM's TP, in chunk 0
            enc_p, enc_tp, dp_enc = self.encoder_params() / tp, tp, lay.data_parallel_size
            enc_layers, enc_held = layers, inflight_microbatches(pp, vpp, 0, m)[0]
        else:
            pp_enc = plan.encoder_pipeline_model_parallel_size
            enc_tp = plan.encoder_tensor_model_parallel_size
            enc_p = self.encoder_params() / (pp_enc * enc_tp)
            dp_enc, enc_layers = plan.encoder_data_parallel_size, math.ceil(layers / pp_enc)
            enc_held = math.ceil(m * enc_tp / tp)  # this GPU's pipeline's micro-batches
        total += states(enc_p, dp_enc, self.encoder_trainable)
        if self.encoder_trainable:
            kept = self.enc_act_bytes / enc_tp if lay.recompute else self.enc_layer.act / enc_tp
            total += enc_held * enc_layers * kept + self.enc_layer.act / enc_tp
        return total
