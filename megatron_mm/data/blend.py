"""Weighted blends of datasets, as Megatron-LM's ``--data-path 0.7 A 0.3 B``.

The blend's sample ``i`` comes from the dataset that is furthest behind its weight after
``i`` samples (Megatron-Core's ``build_blending_indices``, the rule its BlendedDataset
uses), so every prefix of the blend follows the weights within one sample per dataset.
A dataset drawn more often than it has samples starts over (epochs of that dataset).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch.utils.data import Dataset

from .sources import parse_blend  # noqa: F401  (the blend syntax lives with the flags)


def blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset of each blended sample, how many samples that dataset gave before it)."""
    from megatron_mm.startup import require_prepared

    require_prepared(__name__)
    from megatron.core.datasets import helpers

    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    helpers.build_blending_indices(dataset_index, dataset_sample_index,
                                   np.asarray(weights, dtype=np.float64), len(weights), size,
                                   False)
    return dataset_index, dataset_sample_index


class BlendedDataset(Dataset):
    """``datasets`` mixed by ``weights``; an epoch is ``size`` samples (default: the
    datasets' total, so a blend weighted by size reads each sample about once)."""

    def __init__(self, datasets: Sequence, weights: Sequence[float], size: int | None = None):
        if len(datasets) != len(weights):
            raise ValueError(f"{len(datasets)} datasets but {len(weights)} weights")
        for i, ds in enumerate(datasets):
            if len(ds) == 0 and weights[i] > 0:
                raise ValueError(f"dataset {i} of the blend is empty but has weight "
                                 f"{weights[i]}")
        self.datasets, self.weights = list(datasets), list(weights)
        self.size = size if size is not None else sum(len(d) for d in datasets)
        self.dataset_index, self.dataset_sample_index = blending_indices(weights, self.size)

    def __len__(self) -> int:
        return self.size

    def locate(self, idx: int) -> tuple[int, int]:
        """(dataset, index in it) of blended sample ``idx``."""
        d = int(self.dataset_index[idx])
        return d, int(self.dataset_sample_index[idx]) % len(self.datasets[d])

    def __getitem__(self, idx: int):
        d, i = self.locate(idx)
        return self.datasets[d][i]

    @property
    def records(self) -> "BlendedRecords":
        return BlendedRecords(self)

    # The attributes the balanced-data planner reads (every member encodes alike).
    def __getattr__(self, name):
        if name in ("tokenizer", "media_token_counts"):
            return getattr(self.__dict__["datasets"][0], name)
        raise AttributeError(name)


class BlendedRecords(Sequence):
    """The records of a blend in blend order (records are parsed on access)."""

    def __init__(self, blend: BlendedDataset):
        self.blend = blend

    def __len__(self) -> int:
        return len(self.blend)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        d, i = self.blend.locate(idx)
        return self.blend.datasets[d].records[i]
