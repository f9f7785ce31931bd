"""Megatron-Core ``TransformerConfig`` for each module, from our dataclasses.

All modules share the parallel and precision settings (``BuildSettings``); architecture
details (norm, activation, biases) follow the model family each module copies: the LLM's
and the default projector's here, an encoder family's in its folder (through
``encoder_transformer_config`` and ``mlp_projector_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnBackend
from megatron.core.transformer.transformer_config import TransformerConfig

from ..config import LanguageModelConfig, ProjectorConfig
from ..plan.fp8 import Fp8Settings
from ..plan.pipeline.placement import ChunkPlacement, stack_layout
from .fusions import Fusions
from .linear_attention import gdn_transformer_fields
from .mirrored_layout import MirroredLayout


@dataclass
class BuildSettings:
    """Parallel layout, precision and regularisation shared by every module."""

    tensor_model_parallel_size: int = 1
    # The encoders' transformer layers at their own TP (--encoder-tensor-model-parallel-size
    # e < TP, the encoder run as its own pipeline): e and the process groups of this rank's
    # encoder replica (its TP group; the data-parallel group its checkpoint replica ids come
    # from). None: the LLM's TP and groups. Output norms and projectors stay at the LLM's.
    encoder_tensor_model_parallel_size: Optional[int] = None
    encoder_tp_group: Optional[object] = None
    encoder_data_parallel_group: Optional[object] = None
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Optional[int] = None
    # CP ranks per sequence. With our CP attention (``cp_attention`` "ours") it is never
    # passed to TransformerConfig; with Megatron-Core's TE CP it is, with cp_comm_type
    # (see specs.py, choose_cp_attention).
    context_parallel_size: int = 1
    # The MoE layers' experts: split over EP ranks, each expert over ETP ranks (None: TP).
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: Optional[int] = None
    cp_attention: str = "ours"
    cp_comm_type: Optional[str] = None
    # --attention-backend (attention_choice.py): flash / fused / unfused pin TE's kernel
    attention_backend: str = "auto"
    transformer_impl: str = "local"
    media_attention: str = "causal"  # --media-attention: the LLM's mask type on TE
    packed: bool = False  # --data-balance: packed rows (TE: THD, models/packed_sequences.py)
    # Megatron's --sequence-parallel (on at TP > 1 only, as Megatron-LM turns it off at 1).
    sequence_parallel: bool = False
    bf16: bool = False
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    init_method_std: float = 0.02
    # Full weights built on the CPU from one RNG stream, then split: the model then does
    # not depend on the TP size (what the TP-equals-TP=1 tests rely on).
    use_cpu_initialization: bool = True
    # Every chunk's modules (chunk order), from the pipeline plan; None: one chunk.
    placements: Optional[List[ChunkPlacement]] = None
    # Megatron's activation recomputation; each chunk builds its own configs, so adaptive
    # recompute gives each chunk's stacks their own recompute_num_layers ({stack: N}, 0:
    # none there).
    recompute_granularity: Optional[str] = None
    recompute_method: Optional[str] = None
    recompute_num_layers: Union[None, int, Dict[str, int]] = None
    # FP8 (--fp8-format ...) and the modules it applies to; None: no FP8.
    fp8: Optional[Fp8Settings] = None
    # Megatron-LM's kernel fusions (models/fusions.py, chosen for this machine by the
    # trainer); off by default: models built outside DDP (no main_grad) and the CPU path.
    fusions: Fusions = field(default_factory=Fusions)

    def activation(self, func, gated: bool = False) -> dict:
        """``activation_func`` and its bias fusion (the same function either way)."""
        return self.fusions.activation(func, gated)

    def fp8_fields(self, module: Optional[str]) -> dict:
        """The FP8 fields of ``module``'s TransformerConfig ("llm", an encoder's name,
        "<encoder>-projector"): Megatron-Core's TE layers (``get_fp8_context``) and the
        FP8 emulation read them there."""
        if self.fp8 is None or module is None or not self.fp8.applies_to(module):
            return {}
        return self.fp8.transformer_config_fields()

    def common(self, stack: Optional[str] = None, mrope: bool = False) -> dict:
        """Settings of every module. The transformer stacks split over pipeline stages
        (``stack``: "llm" or an encoder's name) get Megatron-Core's pipeline layout from the
        placements, so each chunk builds its layers with their global numbers (checkpoints
        then do not depend on the partition); projectors are never split. An encoder stack
        gets the encoder's TP size."""
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        tp = self.tensor_model_parallel_size
        if stack not in (None, "llm") and self.encoder_tensor_model_parallel_size:
            tp = self.encoder_tensor_model_parallel_size
        pipelined = stack is not None and self.pipeline_model_parallel_size > 1
        if pipelined and stack != "llm" and not any(
                p.encoder(stack) and p.encoder(stack).num_layers for p in self.placements or ()):
            pipelined = False  # its layers run on ranks of their own (separate placement)
        pp = self.pipeline_model_parallel_size if pipelined else 1
        vpp = self.virtual_pipeline_model_parallel_size if pipelined else None
        layout = None
        if pipelined:
            if self.placements is None:
                raise ValueError("pipeline parallelism needs BuildSettings.placements")
            layout, mirrored = stack_layout(self.placements, pp,
                                            None if stack == "llm" else stack)
            interleaved = stack != "llm" and any(
                p.encoder(stack) and p.encoder(stack).interleaved for p in self.placements)
            if mirrored or interleaved:  # placed from the last rank, or its own rounds
                layout = MirroredLayout(layout, pp, mirrored, interleaved)
                vpp = layout.virtual_pipeline_model_parallel_size
                vpp = vpp if vpp > 1 else None
        n = self.recompute_num_layers
        if isinstance(n, dict):
            n = n.get(stack, 0)
        recompute = dict(recompute_granularity=self.recompute_granularity,
                         recompute_method=self.recompute_method, recompute_num_layers=n)
        if stack is None or (self.recompute_granularity == "full" and not n):
            recompute = {}  # projectors are no transformer stack; N = 0: nothing to redo
        return dict(
            **recompute,
            pipeline_model_parallel_layout=layout,
            tensor_model_parallel_size=tp,
            sequence_parallel=self.sequence_parallel and tp > 1,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp,
            # Interleaving with batched p2p is wrong at PP=2 and deadlocks with variable
            # lengths (Megatron-LM #1450); Megatron-LM's own interleaved default is this.
            overlap_p2p_comm=vpp is not None,
            batch_p2p_comm=vpp is None,
            # Micro-batches are padded to their own longest sample, so the p2p shapes vary
            # (the alltoall dispatcher is what config validation accepts with that).
            variable_seq_lengths=pp > 1,
            moe_token_dispatcher_type="alltoall",
            bf16=self.bf16,
            params_dtype=dtype,
            pipeline_dtype=dtype,
            hidden_dropout=self.hidden_dropout,
            attention_dropout=self.attention_dropout,
            init_method_std=self.init_method_std,
            use_cpu_initialization=self.use_cpu_initialization,
            # Loss is summed per token and divided by the global token count (exact DP
            # equivalence at a fixed global batch, whatever the micro-batch split).
            calculate_per_token_loss=True,
            # Each where its kernel exists (fusions.py); bias_activation_fusion comes with
            # the activation (``activation``).
            **self.fusions.config_fields(
                rope=stack == "llm" and not mrope,  # Megatron-Core fuses no M-RoPE batch
                te_linears_only=self.transformer_impl == "transformer_engine"
                and stack != "llm"),
            persist_layer_norm=False,
            attention_softmax_in_fp32=True,
            apply_query_key_layer_scaling=False,
        )


def language_transformer_config(lm: LanguageModelConfig, s: BuildSettings) -> TransformerConfig:
    common = {**s.common("llm", mrope=lm.mrope), **moe_fields(lm, s)}
    config = TransformerConfig(
        num_layers=lm.num_layers,
        hidden_size=lm.hidden_size,
        ffn_hidden_size=lm.ffn_hidden_size,
        num_attention_heads=lm.num_attention_heads,
        num_query_groups=lm.num_query_groups,
        kv_channels=lm.kv_channels,
        normalization="RMSNorm",
        layernorm_epsilon=lm.norm_epsilon,
        gated_linear_unit=True,
        **s.activation(F.silu, gated=True),
        add_bias_linear=False,
        add_qkv_bias=lm.add_qkv_bias,
        qk_layernorm=lm.qk_layernorm,
        mrope_section=list(lm.mrope_section) if lm.mrope else None,
        attention_output_gate=lm.attention_output_gate,
        layernorm_zero_centered_gamma=lm.apply_layernorm_1p,
        **gdn_transformer_fields(lm),
        **common,
        **s.fp8_fields("llm"),
        **_te_context_parallel(s),
        **_te_kernel(s),
    )
    if lm.position_embedding_type == "yarn":  # read by GPTModel's and Attention's YaRN
        for name, value in lm.yarn.transformer_config_attributes().items():
            setattr(config, name, value)
    return config


def _te_kernel(s: BuildSettings) -> dict:
    """Megatron-LM's --attention-backend flash|fused|unfused: Megatron-Core's
    ``LanguageModule`` pins TE's kernel from it (``NVTE_*_ATTN``); the other values leave
    TE's own choice (``auto``)."""
    if s.attention_backend not in ("flash", "fused", "unfused"):
        return {}
    return dict(attention_backend=AttnBackend[s.attention_backend])


def moe_fields(lm: LanguageModelConfig, s: BuildSettings) -> dict:
    """Megatron-Core's MoE fields of the LLM (none for a dense one): dropless top-k routing
    (no capacity factor), the layer pattern as one 0/1 per layer, the expert grid."""
    moe = lm.moe
    if moe is None:
        return {}
    return dict(
        num_moe_experts=moe.num_experts,
        moe_ffn_hidden_size=moe.ffn_hidden_size,
        moe_layer_freq=list(moe.pattern(lm.num_layers)),
        moe_router_topk=moe.router_topk,
        moe_router_pre_softmax=moe.router_pre_softmax,
        moe_router_load_balancing_type=moe.router_load_balancing_type,
        moe_aux_loss_coeff=moe.aux_loss_coeff,
        moe_token_dispatcher_type=moe.token_dispatcher_type,
        moe_grouped_gemm=moe.grouped_gemm,
        moe_shared_expert_intermediate_size=moe.shared_expert_intermediate_size,
        moe_shared_expert_gate=moe.shared_expert_gate,
        expert_model_parallel_size=s.expert_model_parallel_size,
        expert_tensor_parallel_size=(s.expert_tensor_parallel_size
                                     or s.tensor_model_parallel_size),
    )


def _te_context_parallel(s: BuildSettings) -> dict:
    """Megatron-Core's CP settings, only when its TE CP attention runs the LLM's CP."""
    if s.context_parallel_size == 1 or s.cp_attention != "transformer_engine":
        return {}
    return dict(context_parallel_size=s.context_parallel_size, cp_comm_type=s.cp_comm_type)


def encoder_transformer_config(enc, s: BuildSettings, name: str,
                               num_layers: Optional[int] = None, **arch) -> TransformerConfig:
    """An encoder's layers: its sizes (``num_layers``: its built layers unless given), the
    shared settings of stack ``name``, and the family's own fields (``arch``: norm,
    activation, biases, head size...)."""
    return TransformerConfig(
        num_layers=enc.num_layers_built if num_layers is None else num_layers,
        hidden_size=enc.hidden_size,
        ffn_hidden_size=enc.ffn_hidden_size,
        num_attention_heads=enc.num_attention_heads,
        **arch,
        **s.common(name),
        **s.fp8_fields(name),
    )


def mlp_projector_config(s: BuildSettings, name: Optional[str], hidden_size: int,
                         ffn_hidden_size: int, num_attention_heads: int, activation_func,
                         **arch) -> TransformerConfig:
    """A projector's MLP (a ``MultimodalProjector``: input -> ``ffn_hidden_size`` ->
    ``hidden_size``, biased, not gated). Attention fields are unused; the head count only
    passes TransformerConfig's TP checks. ``name``: the projector's encoder, for its FP8
    setting ("<name>-projector")."""
    return TransformerConfig(
        num_layers=1,
        hidden_size=hidden_size,
        ffn_hidden_size=ffn_hidden_size,
        num_attention_heads=num_attention_heads,
        gated_linear_unit=False,
        activation_func=activation_func,
        add_bias_linear=True,
        **arch,
        **s.common(),
        **s.fp8_fields(name and f"{name}-projector"),
    )


def projector_transformer_config(proj: ProjectorConfig, lm: LanguageModelConfig,
                                 s: BuildSettings, name: Optional[str] = None
                                 ) -> TransformerConfig:
    """The MLP projector: the encoder width to ffn_hidden_size, then to hidden_size (the
    LLM's)."""
    return mlp_projector_config(s, name, lm.hidden_size, proj.ffn_hidden_size or lm.hidden_size,
                                lm.num_attention_heads, F.gelu)
