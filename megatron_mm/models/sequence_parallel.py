"""Sequence parallelism (Megatron's ``--sequence-parallel``) where the multimodal model
differs from Megatron-Core's GPTModel: the text embeddings, encoder hidden states,
projected features and the answer-only output layer.

Under SP each TP rank holds 1/TP of every sequence (dim 0 of Megatron's [S, B, H]) in the
norms, residuals and dropouts; the column-parallel linears all-gather it and the
row-parallel ones reduce-scatter back (Megatron-Core does that inside its layers). This
module places the remaining boundaries:

- the text embeddings are whole on the stage that merges media features into them (the
  merge writes anywhere in the sequence, as Megatron-Core's LLaVA model does before it
  scatters); they enter the LLM's layers as this rank's shard;
- an encoder's layers run on its shard of the encoder sequence (``split`` after the
  patch or convolution embedding; a ViT's padding to a multiple of TP is masked); its
  output norm and projector run on the shard too, and the projected features are gathered
  once for the merge;
- between pipeline stages travel the shards: of the text embeddings (``split`` before
  sending, ``gather`` on the stage that merges) and of the encoder hidden state;
- the output layer at the answer tokens only (``logits_at``) takes its rows from the
  gathered hidden state.

``gather`` / ``split`` are for tensors whose consumers compute the same thing on every TP
rank (the merge), so the backward of ``gather`` keeps this rank's part of an already
complete gradient (no reduction), and that of ``split`` all-gathers it.
"""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel


def split(x: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's shard of a sequence-first tensor every TP rank holds whole."""
    return tensor_parallel.scatter_to_sequence_parallel_region(x, group=group)


def gather(x: torch.Tensor, group=None) -> torch.Tensor:
    """The whole sequence from every rank's shard, for a consumer that computes the same on
    every TP rank (its gradient is complete on each: the backward keeps this rank's part)."""
    return tensor_parallel.gather_from_sequence_parallel_region(
        x, tensor_parallel_output_grad=False, group=group)


def project_shard(encoder, projector, hidden: torch.Tensor, projector_type: str,
                  group=None) -> torch.Tensor:
    """Encoder output norm (and pooling) and projector on this rank's shard [T/TP, N, H_enc]
    of an encoder's last hidden state, then the features gathered: [N, T', H_llm].

    The projector's linears run sequence-parallel on the rows of the flattened shard in
    (token, item) order, so the reduce-scattered output is again this rank's token range.
    The affine projector's single column-parallel linear gathers its output whole.
    """
    x = encoder.shard_features(hidden)  # [T_local, N, H_enc]: per-token ops only
    t, n, h = x.shape
    y = projector(x.reshape(t * n, h))
    y = y.view(-1, n, y.shape[-1])
    if projector_type != "affine":  # the affine projector gathers its output itself
        y = gather(y, group)
    if encoder.sp_padding:  # the tokens that made the sequence divide over the ranks
        y = y[:y.shape[0] - encoder.sp_padding]
    return encoder.select_output_tokens(y.transpose(0, 1)).contiguous()


def logits_at(output_layer, output_weight, hidden: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
    """The output layer's logits [n, 1, V/TP] at ``positions`` ([n] long: flat positions
    of the whole [S, B], ``BatchLayout.loss_positions``) of a sequence-parallel hidden
    state (this rank's shard [S/TP, B, H]): the selected rows, padded to a multiple of
    TP, are split over the ranks again for the output layer's own sequence-parallel
    gather (so its input gradient is reduce-scattered as usual). Index ops of host-known
    sizes only: no host sync."""
    group = output_layer.tp_group
    whole = gather(hidden, group)  # [S, B, H], the same on every rank
    selected = whole.reshape(-1, whole.shape[-1]).index_select(0, positions)  # [n, H]
    n, ranks = selected.shape[0], group.size()
    pad = -n % ranks
    if pad:
        selected = torch.cat([selected, selected.new_zeros(pad, selected.shape[1])])
    logits, _ = output_layer(split(selected.unsqueeze(1), group), weight=output_weight)
    return logits[:n]
