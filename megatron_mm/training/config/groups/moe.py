"""Mixture of experts in the LLM's MLPs (Megatron-LM's flags)."""

from dataclasses import dataclass
from typing import List, Optional, Union

from ..moe_args import DISPATCHERS, LOAD_BALANCING, moe_freq_type
from .fields import flag


@dataclass(frozen=True)
class MoeArgs:
    """Mixture of experts in the LLM's MLPs (Megatron-LM's flags)."""

    num_experts: Optional[int] = None
    """experts per MoE layer (default: none, a dense LLM)"""
    moe_ffn_hidden_size: Optional[int] = None
    """each expert's hidden size (default: --ffn-hidden-size); the dense layers keep
    --ffn-hidden-size"""
    moe_layer_freq: Union[int, List[int]] = flag(1, type=moe_freq_type)
    """an int N: layer i is an MoE layer when i % N == 0, the others dense; or one 0/1 per layer
    as a list expression, e.g. "([0]+[1]*3)*2" (1: MoE, 0: dense)"""
    moe_router_topk: int = 2
    """experts each token is routed to"""
    moe_router_pre_softmax: bool = False
    """softmax over all experts before the top-k (the top-k probabilities are not renormalised);
    default: softmax over the top-k logits (renormalised, Hugging Face's norm_topk_prob)"""
    moe_router_load_balancing_type: str = flag("aux_loss", choices=LOAD_BALANCING)
    """aux_loss: GShard / Switch Transformer's load-balancing loss per micro-batch (scaled by
    --moe-aux-loss-coeff); seq_aux_loss: per sample; global_aux_loss: over the data-parallel
    batch; sinkhorn: S-BASE; none"""
    moe_aux_loss_coeff: float = 0.0
    """scaling coefficient for the aux loss (1e-2 is a good start)"""
    moe_token_dispatcher_type: str = flag("allgather", choices=DISPATCHERS)
    """how tokens reach their experts' ranks: allgather, or alltoall (needed with pipeline
    parallelism: micro-batches vary in length)"""
    moe_grouped_gemm: bool = False
    """all local experts in one grouped GEMM (Transformer Engine's TEGroupedMLP: --transformer-impl
    transformer_engine on CUDA); default: one MLP per expert (SequentialMLP)"""
    moe_shared_expert_intermediate_size: Optional[int] = None
    """a shared expert of this hidden size beside the routed ones, run for every token
    (Qwen3.5-MoE); default: none"""
    moe_shared_expert_gate: bool = False
    """scale the shared expert's output by a sigmoid gate of the token"""
    moe_per_layer_logging: bool = False
    """also write each MoE layer's load-balancing loss to TensorBoard
    (moe/load_balancing_loss_layer_<i>)"""
