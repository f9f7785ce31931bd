"""How the ranks share the model and the data (TP, PP, CP, EP, DP) and their communication."""

from dataclasses import dataclass, field
from typing import List, Literal, Optional

from ....config import ConfigError

from ....plan.context_parallel.cp_assignment import BLOCK_OVERHEAD
from .fields import DERIVED


@dataclass(frozen=True)
class ParallelArgs:
    """How the ranks share the model and the data (TP, PP, CP, EP, DP) and their communication."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    """ranks sharing one sequence (any --media-attention mask; tokens assigned by
    --context-parallel-assignment)"""
    context_parallel_assignment: Literal["contiguous", "zigzag", "lpt", "ours"] = "ours"
    """how tokens go to CP ranks: blocks by position (contiguous, zigzag) or by their attention
    work (lpt; ours = LPT + local search)"""
    context_parallel_block: int = 128
    """tokens per assignment block; shorter sequences than block x CP size are not split"""
    context_parallel_block_overhead: float = BLOCK_OVERHEAD
    """fixed cost of one query block in the CP attention kernel, in attention tiles, for the token
    assignment's load model (measure with tools/bench_cp_attention.py --calibrate)"""
    cp_comm_type: Optional[Literal["p2p", "a2a", "allgather", "a2a+p2p"]] = None
    """Megatron-Core's TE CP attention only (TE on CUDA, --transformer-impl transformer_engine,
    causal mask, --context-parallel-assignment zigzag), one type for every layer; default p2p
    there. Our CP attention all-gathers K/V and rejects this flag"""
    vision_dp_when_cp: bool = False
    """with --context-parallel-size > 1, each CP rank encodes a share of the micro-batch's media
    items (every encoder's), balanced by their vision work, and the features are all-gathered
    over the CP group (their gradients reduce-scattered); default: every CP rank encodes every
    item (Megatron-Bridge's vision_dp_when_cp)"""
    media_attention: Literal["causal", "bidirectional"] = "causal"
    """how media tokens attend in the LLM: causally like text, or bidirectionally within their own
    item (text stays causal)"""
    virtual_pipeline_model_parallel_size: Optional[int] = None
    """model chunks per pipeline rank (interleaved 1F1B)"""
    num_layers_per_virtual_pipeline_stage: Optional[int] = None
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    """the distributed optimizer's parameter all-gather in the next forward, bucket by bucket, as
    each bucket is first used (needs --use-distributed-optimizer and --overlap-grad-reduce)"""
    ddp_bucket_size: Optional[int] = None
    """parameters per DDP bucket (default: Megatron-Core's)"""
    distributed_backend: Optional[Literal["nccl", "gloo"]] = None
    """default: nccl with CUDA, gloo without"""
    distributed_timeout_minutes: int = 10
    expert_model_parallel_size: int = 1
    """ranks the experts of each MoE layer are split over"""
    expert_tensor_parallel_size: Optional[int] = None
    """tensor parallelism inside each expert (default: --tensor-model-parallel-size)"""
    sequence_parallel: bool = False
    """split the sequence over the tensor-parallel ranks in the norms, residuals and dropouts of
    the LLM, the encoders and the projectors (Megatron's sequence parallelism; off at
    --tensor-model-parallel-size 1, as in Megatron-LM)"""
    world_size: Optional[int] = field(default=None, metadata=DERIVED)
    """Derived by validation (not a flag)."""
    data_parallel_size: Optional[int] = field(default=None, metadata=DERIVED)
    """Derived by validation (not a flag)."""

    def errors(self) -> List[ConfigError]:
        """This group's own checks, each naming its flag."""
        out = []
        if self.context_parallel_size < 1:
            out.append(ConfigError("--context-parallel-size must be >= 1"))
        if self.overlap_param_gather and not (self.use_distributed_optimizer
                                              and self.overlap_grad_reduce):
            out.append(ConfigError("--overlap-param-gather needs --use-distributed-optimizer "
                                   "and --overlap-grad-reduce (as in Megatron-LM)"))
        if self.context_parallel_block < 1:
            out.append(ConfigError("--context-parallel-block must be >= 1"))
        if self.context_parallel_block_overhead < 0:
            out.append(ConfigError("--context-parallel-block-overhead must be >= 0"))
        return out
