"""A sample's LLM work from the model's layers, for the balance metrics (``measure``).

Counting a sample's LLM work as its tokens treats every layer as linear in the sequence.
``LLMWork`` charges what the cost model does instead: the forward FLOPs of one sequence of
that length through every LLM layer, each by its kind (``flops.llm_layer``): a full-
attention layer grows with S^2 (its score pairs), a Gated DeltaNet layer of a hybrid
(Qwen3.5) linearly (its chunked delta rule), so for a hybrid LLM the work stays close to
proportional to the tokens where an all-attention LLM's does not. Packed samples attend
only within themselves: a packed micro-batch's work is the sum over its samples.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict

from ..costs import flops
from ..model import TransformerSpec


class LLMWork:
    """``work(tokens)``: forward FLOPs of one ``tokens``-long sequence through the LLM."""

    def __init__(self, llm: TransformerSpec):
        self.llm = llm
        # layers of each kind (MoE, Gated DeltaNet): each kind is costed once per length
        self.kinds = Counter((llm.is_moe(i), llm.is_linear(i)) for i in range(llm.num_layers))

        self._cache: Dict[int, float] = {}

    def __call__(self, tokens: int) -> float:
        if tokens not in self._cache:
            self._cache[tokens] = sum(
                n * flops.transformer_layer(self.llm, 1, tokens, True, moe, linear=linear).fwd
                for (moe, linear), n in self.kinds.items())
        return self._cache[tokens]
