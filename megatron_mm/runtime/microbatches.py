"""The iteration's micro-batches as the schedule executor reads them: lazily, in order.

Megatron-Core's schedules call ``forward_step_func(data_iterator, model)`` on every stage
and Megatron-LM hands the stages that need no data ``None`` iterators (its ``get_batch``
returns ``None`` there). The executor reads micro-batch ``m`` when an action of this rank
first needs it (an encoder piece's media, a message's shape, an LLM forward), reading the
ones before it first, so the iterator is consumed in micro-batch order whatever order
the schedule runs them in, and a stage never reads ahead further than its schedule
needs. With virtual stages every model chunk has its own iterator (Megatron-LM's list,
alike copies): they are read in step. A stage without any iterator has no batches; what
needs one there is refused with an error that says what needs it.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence


class NoData(RuntimeError):
    """An action of a stage without a data iterator needs the micro-batch."""


class Microbatches:
    def __init__(self, iterators: Sequence[Optional[Iterator]], num_microbatches: int,
                 rank: int):
        self.iterators = [it for it in iterators if it is not None]
        self.num_microbatches, self.rank = num_microbatches, rank
        self.read: List[dict] = []

    @property
    def has_data(self) -> bool:
        return bool(self.iterators)

    def __getitem__(self, m: int) -> dict:
        """Micro-batch ``m`` (read with those before it on first use)."""
        if not self.iterators:
            raise NoData(f"pipeline rank {self.rank} was given no data iterator (Megatron-LM "
                         "gives stages other than the first and last None), but its "
                         f"part of the schedule needs micro-batch {m}")
        while len(self.read) <= m:
            self.read.append(next(self.iterators[0]))
            for other in self.iterators[1:]:  # the per-chunk copies stay in step
                next(other)
        return self.read[m]

    def get(self, m: int) -> Optional[dict]:
        """Micro-batch ``m``, or None on a stage without data."""
        return self[m] if self.iterators else None

    def finish(self) -> None:
        """Read what no action needed, as Megatron-Core's schedules read one per
        micro-batch on every stage that has an iterator."""
        if self.iterators and self.num_microbatches:
            self[self.num_microbatches - 1]
