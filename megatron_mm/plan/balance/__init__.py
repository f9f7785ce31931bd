"""Balanced data (OmniBal), pure Python: per-sample vision / LLM work, ISF packing with
searched bounds, placement of packed groups on data-parallel ranks, the balance metrics,
and the resumable sampler the training loop draws from.

    loads = read_all(["stats_dir"])                   # [SampleLoad(vision, tokens), ...]
    best = search_bounds(loads, dp=8, samples_per_group=4)
    sampler = BalancedSampler(loads, best.bounds, rank, dp, seed=1234)
"""

from .baselines import length_sorted_batches, random_batches, steps_of
from .isf import Bounds, Grouping, isf, random_groups
from .llm_work import LLMWork
from .loads import SampleLoad, read_all, read_length_stats, stats_files
from .metrics import BalanceMetrics, imbalance, measure, padding_ratio
from .rounds import ROUNDS, random_rounds, sorted_rounds, split_to_multiple
from .sampler import BalancedSampler
from .search import Candidate, parse_bounds, search_bounds

METHODS = tuple(ROUNDS)  # the --data-balance choices besides "none"

__all__ = [
    "METHODS", "ROUNDS", "BalanceMetrics", "BalancedSampler", "Bounds", "Candidate",
    "Grouping", "LLMWork", "SampleLoad", "imbalance", "isf", "length_sorted_batches", "measure",
    "padding_ratio", "random_batches", "random_groups", "random_rounds", "read_all",
    "parse_bounds", "read_length_stats", "search_bounds", "sorted_rounds", "split_to_multiple",
    "stats_files",
    "steps_of",
]
