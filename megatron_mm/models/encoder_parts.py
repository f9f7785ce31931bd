"""What the encoders built in parts (ViT, audio) share: their transformer layers, run whole
or as a range of global layer numbers (one encoder piece of the encoder's own pipeline),
and, with an encoder TP smaller than the LLM's, their own process groups."""

from __future__ import annotations

import itertools
from contextlib import nullcontext
from typing import List, Optional, Tuple

import torch

from . import sequence_parallel
from .fp8_context import checkpoint, fp8_region, get_fp8_context, reduces_amax


class EncoderParts:
    """Mixed into an encoder module that has ``decoder`` (a TransformerBlock or None)."""

    decoder: Optional[torch.nn.Module]
    # The encoder's own groups (encoder TP < LLM TP), else None: the LLM's serve.
    checkpoint_dp_group = None

    def use_encoder_groups(self, pg_collection, checkpoint_dp_group) -> None:
        """Build the layers on ``pg_collection`` (its ``tp``: this rank's encoder-TP group)
        and checkpoint with replica ids over ``checkpoint_dp_group`` (the ranks holding the
        same encoder shard). None, None: Megatron-Core's default groups."""
        if pg_collection is not None:
            self.tp_group = pg_collection.tp  # read by MegatronModule.sharded_state_dict
        self.checkpoint_dp_group = checkpoint_dp_group

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None):
        if self.checkpoint_dp_group is not None:  # replica ids among this shard's holders
            metadata = {**(metadata or {}), "dp_cp_group": self.checkpoint_dp_group}
        return super().sharded_state_dict(prefix, sharded_offsets, metadata)

    def piece_parameters(self) -> List[torch.nn.Parameter]:
        """The parameters that encoder pieces (``EF`` / ``EB`` actions) compute: the
        embedding and the transformer layers, not the output norm (``ln_post``), which runs
        with the projector."""
        return [p for name, p in self.named_parameters() if not name.startswith("ln_post.")]

    # Tokens appended to the encoder's sequence so that it divides over the TP ranks under
    # sequence parallelism (the ViT's patches plus class token); the layers take them as
    # padding (``padding_mask``, mask type ``padding``), the output drops them.
    sp_padding: int = 0

    @property
    def layer_seq_length(self) -> int:
        """The sequence the layers run: ``seq_length`` plus ``sp_padding``."""
        return self.seq_length + self.sp_padding

    def padding_mask(self, items: int, device) -> Optional[torch.Tensor]:
        """[items, 1, 1, T] bool, True at the padding keys (None: no padding). The key
        padding mask Transformer Engine's ``padding`` mask type takes for ``sbhd``
        (``dot_product_attention.utils.get_cu_seqlens``: right padding), and which
        Megatron-Core's local attention broadcasts over heads and queries."""
        if not self.sp_padding:
            return None
        keys = torch.arange(self.layer_seq_length, device=device) >= self.seq_length
        return keys.expand(items, -1)[:, None, None]

    @property
    def sequence_parallel_group(self):
        """The group an encoder's sequence is sharded over under ``--sequence-parallel``:
        its TP group (None: Megatron-Core's default)."""
        return getattr(self, "tp_group", None)

    def to_sequence_parallel(self, hidden: torch.Tensor) -> torch.Tensor:
        """The embedding's output [T, N, H] as the layers take it: padded, then this rank's
        shard of the sequence under sequence parallelism, else whole."""
        if self.sp_padding:
            hidden = torch.nn.functional.pad(hidden, (0, 0, 0, 0, 0, self.sp_padding))
        if not self.config.sequence_parallel:
            return hidden
        return sequence_parallel.split(hidden, self.sequence_parallel_group)

    def layer_inputs(self, hidden: torch.Tensor) -> dict:
        """Keyword arguments every layer takes next to the hidden state: the padding mask;
        a family adds its own (Qwen2.5-VL: window masks and rotary angles of the batch)."""
        return {"attention_mask": self.padding_mask(hidden.shape[1], hidden.device)
                if self.sp_padding else None}

    def set_input_tensor(self, input_tensor: torch.Tensor) -> None:
        """Unused: the multimodal model hands each part its input explicitly."""

    def layers(self, hidden: torch.Tensor, start: Optional[int] = None,
               end: Optional[int] = None) -> torch.Tensor:
        """This part's transformer layers, or those numbered ``[start, end)`` (0-based,
        encoder-wide) among them."""
        if self.decoder is None:
            return hidden
        inputs = self.layer_inputs(hidden)
        config = self.decoder.config
        with fp8_region(config, self.training):
            if start is None and end is None:
                return self.decoder(hidden, **inputs)
            # TransformerBlock.forward's FP8 contexts, which a piece bypasses: the region
            # above for delayed scaling, one per layer otherwise.
            per_layer = bool(config.fp8) and not reduces_amax(config)
            tp_group = self.decoder.pg_collection.tp
            for layers, recompute in self._piece_groups(start, end):
                run = _run_layers(layers, inputs, per_layer_fp8=per_layer)
                hidden = (checkpoint(run, config, tp_group, hidden) if recompute
                          else run(hidden))
        return hidden

    def idle_input(self) -> torch.Tensor:
        """Zeros shaped like one item's hidden state as the layers take it (this rank's
        shard under sequence parallelism): an FP8 encoder's run on a micro-batch without
        its media (``fp8_context``)."""
        param, config = next(self.decoder.parameters()), self.decoder.config
        length = self.layer_seq_length
        if config.sequence_parallel:
            length //= config.tensor_model_parallel_size
        return torch.zeros(length, 1, config.hidden_size, dtype=config.params_dtype,
                           device=param.device)

    def _piece_groups(self, start: int, end: int) -> List[Tuple[list, bool]]:
        """The layers of ``[start, end)`` in runs, each with whether it is recomputed: what
        Megatron-Core's ``--recompute-granularity full`` does to this rank's block
        (``uniform``: groups of N layers, each one checkpoint; ``block``: the block's first
        N layers, one by one), cut at the piece's ends."""
        config, block = self.decoder.config, list(self.decoder.layers)
        mine = [i for i, layer in enumerate(block) if start <= layer.layer_number - 1 < end]
        active = (config.recompute_granularity == "full" and self.training
                  and torch.is_grad_enabled())
        n = config.recompute_num_layers

        def group(i: int) -> Tuple[bool, int]:  # (recomputed, checkpoint it belongs to)
            if not active:
                return False, 0
            if config.recompute_method == "uniform":
                return True, i // n
            return (True, i) if i < n else (False, 0)  # block: one checkpoint per layer

        return [([block[i] for i in run], key[0])
                for key, run in itertools.groupby(mine, key=group)]


def _run_layers(layers, inputs: dict, per_layer_fp8: bool = False):
    def run(hidden: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            context = (get_fp8_context(layer.config, layer.layer_number - 1)
                       if per_layer_fp8 else nullcontext())
            with context:
                hidden, _ = layer(hidden_states=hidden, **inputs)
        return hidden
    return run
