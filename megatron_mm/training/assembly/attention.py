"""The LLM attention mask of each micro-batch, from the flags: ``--media-attention`` and,
with ``--context-parallel-size`` > 1, this CP rank's share of the tokens."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Optional, Union

import torch
from megatron.core import parallel_state

from ...models.batch_layout import EncoderCP
from ...models.packed_sequences import PackedSequences, packed_sequences
from ...models.specs import uses_thd
from ...models.context_parallel import (
    ContextParallelMask, batch_codes, context_parallel_mask, dense_mask)
from ...models.flex_attention import MaskCodes
from ...models.linear_attention_cp import with_gdn_tokens
from ...models.host_copy import to_device
from ...config import ConfigError
from ...plan.context_parallel.cp_assignment import BLOCK_OVERHEAD
from .build_settings import transformer_impl


@dataclass(frozen=True)
class AttentionSettings:
    media_tokens: Mapping[int, int]  # placeholder id -> tokens per media item
    media_attention: str = "causal"
    context_parallel_size: int = 1
    assignment: str = "ours"
    block: int = 128
    block_overhead: float = BLOCK_OVERHEAD  # tiles per block in the load model
    cp_attention: str = "ours"  # CPAttentionChoice.kind (models/attention_choice.py)
    vision_dp_when_cp: bool = False  # each CP rank encodes a share of the items
    packed_thd: bool = False  # packed rows go to TE's THD attention (specs.uses_thd)
    # Gated DeltaNet layers: packed rows carry their cu_seqlens to them on either path
    linear_attention: bool = False

    @classmethod
    def from_config(cls, config, tokenizer, cp_attention: str = "ours") -> "AttentionSettings":
        media = {}
        for name, enc in config.model_config.encoders.items():
            if enc.num_output_tokens is None:  # items of their own lengths (Qwen2.5-VL)
                if config.parallel.media_attention == "bidirectional":
                    raise ConfigError(
                        f"--media-attention bidirectional needs every {name} item's token "
                        f"count from the placeholder runs; the {enc.model_type} encoder's "
                        "items vary in length (and its LLM attends causally): use "
                        "--media-attention causal")
                continue  # causal: media attend as text, no item boundaries needed
            media[tokenizer.media_token_id("image")] = enc.num_output_tokens
        parallel = config.parallel
        thd = uses_thd(transformer_impl(config.model), parallel.media_attention,
                       config.data.data_balance != "none", parallel.context_parallel_size > 1)
        return cls(media, parallel.media_attention, parallel.context_parallel_size,
                   parallel.context_parallel_assignment, parallel.context_parallel_block,
                   parallel.context_parallel_block_overhead, cp_attention,
                   parallel.vision_dp_when_cp, thd,
                   config.model_config.language.linear_attention is not None)

    def encoder_cp(self, split: bool = True) -> Optional[EncoderCP]:
        """The CP group the encoders' items are split over (``--vision-dp-when-cp``), or
        None: every CP rank encodes every item (also when nothing is split: validation)."""
        if not (split and self.vision_dp_when_cp and self.context_parallel_size > 1):
            return None
        return EncoderCP(self.context_parallel_size, parallel_state.get_context_parallel_rank(),
                         parallel_state.get_context_parallel_group())

    def mask_for(self, batch: dict, split: bool = True, device=None
                 ) -> Union[None, torch.Tensor, MaskCodes, ContextParallelMask,
                       PackedSequences]:
        """What the model takes as ``attention_mask`` for ``batch``, from its tokens on the
        host: None (Megatron's causal mask) for unpacked causal batches; packed samples on
        TE's THD attention: their ``PackedSequences`` (int32 ``cu_seqlens`` from the host);
        else the mask of the codes (packed samples from ``cu_seqlens``, media items with
        ``--media-attention bidirectional``): for this CP rank, planned on the host
        (``.to(device)`` copies its O(S) tensors), or whole (``split=False``, or no context
        parallelism): dense, made on ``device`` (default: the tokens') from the O(S)
        codes, or for FlexAttention the codes themselves (``MaskCodes``)."""
        cp = self.context_parallel_size if split else 1
        if cp == 1 and self.media_attention == "causal" and "cu_seqlens" not in batch:
            return None
        tokens = batch["tokens"]
        if cp == 1 and self.packed_thd and "cu_seqlens" in batch:
            return packed_sequences(batch["cu_seqlens"]).to(
                tokens.device if device is None else device)
        codes = batch_codes(tokens, self.media_tokens, doc_ids(batch), self.media_attention)
        if cp == 1:
            dev = tokens.device if device is None else device
            if self.cp_attention == "flex":  # the codes alone: its block mask comes from them
                mask = MaskCodes(to_device(torch.from_numpy(codes), dev))
            else:
                mask = dense_mask(codes, dev)
            if self.linear_attention and "cu_seqlens" in batch:  # the GDN layers' samples
                return dataclasses.replace(packed_sequences(batch["cu_seqlens"]).to(dev),
                                           mask=mask)
            return mask
        cpm = context_parallel_mask(
            codes, self.context_parallel_size, parallel_state.get_context_parallel_rank(),
            self.assignment, self.block, parallel_state.get_context_parallel_group(),
            tokens.device, self.block_overhead)
        if self.cp_attention == "transformer_engine":
            check_te_zigzag(cpm, codes.shape[1], self.block)
        if self.linear_attention:  # the GDN layers' way to natural order (and samples)
            cpm = with_gdn_tokens(cpm, batch.get("cu_seqlens"))
        return cpm


def doc_ids(batch: dict) -> Optional[torch.Tensor]:
    """Packed-sample number per token ([B, S]) of a packed batch, None otherwise."""
    cu = batch.get("cu_seqlens")
    if cu is None:
        return None
    lengths = (cu[1:] - cu[:-1]).long().cpu()
    return torch.repeat_interleave(torch.arange(len(lengths)), lengths)[None]


def check_te_zigzag(cpm: ContextParallelMask, seq_length: int, block: int) -> None:
    """TE's CP takes each rank's tokens as chunks r and 2P-1-r of 2P equal chunks: our
    zigzag split is that only when the sequence is whole blocks, 2P of them at least."""
    p, r = len(cpm.counts), cpm.cp_rank
    chunk = seq_length // (2 * p)
    expected = list(range(r * chunk, (r + 1) * chunk)) + list(
        range((2 * p - 1 - r) * chunk, (2 * p - r) * chunk))
    if cpm.replicated or seq_length % (2 * p) or cpm.local.tolist() != expected:
        raise ConfigError(
            f"Megatron-Core's TE CP attention needs every micro-batch's length ({seq_length})"
            f" to be a multiple of 2 x --context-parallel-size x --context-parallel-block "
            f"({2 * p * block}): pad the batches to it, or take our CP attention "
            "(--context-parallel-assignment ours)")


def local_length(attention, batch: dict) -> int:
    """This context-parallel rank's token count of ``batch`` (host data): the sequence
    length of the hidden states between LLM chunks."""
    return attention.mask_for(batch).local.shape[0]
