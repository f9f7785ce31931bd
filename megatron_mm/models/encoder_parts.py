"""What the encoders built in parts (ViT, audio) share: their transformer layers, run whole
or as a range of global layer numbers (one encoder piece of the encoder's own pipeline)."""

from __future__ import annotations

from typing import Optional

import torch


class EncoderParts:
    """Mixed into an encoder module that has ``decoder`` (a TransformerBlock or None)."""

    decoder: Optional[torch.nn.Module]

    def set_input_tensor(self, input_tensor: torch.Tensor) -> None:
        """Unused: the multimodal model hands each part its input explicitly."""

    def layers(self, hidden: torch.Tensor, start: Optional[int] = None,
               end: Optional[int] = None) -> torch.Tensor:
        """This part's transformer layers, or those numbered ``[start, end)`` (0-based,
        encoder-wide) among them."""
        if self.decoder is None:
            return hidden
        if start is None and end is None:
            return self.decoder(hidden, attention_mask=None)
        for layer in self.decoder.layers:
            if start <= layer.layer_number - 1 < end:
                hidden, _ = layer(hidden_states=hidden, attention_mask=None)
        return hidden
