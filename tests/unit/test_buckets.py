"""Optimal bucket edges: exactness against brute force, speed at full scale, edge validation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.buckets import assign, optimize, optimize_all, padded_to_edges, validate_edges
from pipeline.core.config import ConfigError
from pipeline.core.synthetic import seed902k_lengths


def _brute_force(lengths: np.ndarray, k: int) -> int:
    v = np.unique(lengths)
    best = None
    for cut in itertools.combinations(range(v.size - 1), k - 1):
        edges = [0] + [int(v[i]) for i in cut] + [int(v[-1])]
        cost = padded_to_edges(lengths, edges)
        best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(1, 6))
def test_optimize_equals_brute_force_on_small_histograms(raw, k):
    lengths = np.asarray(raw)
    k = min(k, np.unique(lengths).size)
    edges = optimize(lengths, k)
    assert len(edges) == k + 1 and edges[0] == 0 and edges[-1] == lengths.max()
    assert padded_to_edges(lengths, edges) == _brute_force(lengths, k)


def test_optimize_all_costs_decrease_with_k_and_match_edges():
    lengths = seed902k_lengths(30_000, seed=5)
    table = optimize_all(lengths, 16)
    costs = [table.cost[k] for k in range(1, 17)]
    assert all(b <= a for a, b in zip(costs, costs[1:], strict=False))
    for k in (1, 5, 16):
        assert padded_to_edges(lengths, table.for_k(k)) - lengths.sum() == table.cost[k]


def test_more_buckets_than_distinct_lengths_gives_zero_padding():
    lengths = np.array([3, 3, 7, 7, 7, 100])
    edges = optimize(lengths, 10)
    assert edges == [0, 3, 7, 100]
    assert padded_to_edges(lengths, edges) == lengths.sum()


def test_optimize_902k_k32_pads_under_5_percent():
    # Its speed is measured by the benchmark (bench), not asserted here.
    lengths = seed902k_lengths()
    edges = optimize(lengths, 32)
    # To-upper-edge padding efficiency of exact K=32 edges on the calibrated preset.
    assert lengths.sum() / padded_to_edges(lengths, edges) > 0.95


def test_assign_upper_edge_is_inclusive():
    assert assign(np.array([1, 770, 771, 8192]), [0, 770, 8192]).tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize(
    "edges, fragment",
    [
        ([0, 770, 700], "strictly increasing: got [0, 770, 700]"),
        ([5, 10], "must start at 0"),
        ([0], "at least two values"),
        ([0, 1.5, 3], "integers"),
    ],
)
def test_contract10_bad_edges_name_the_fix(edges, fragment):
    with pytest.raises(ConfigError, match=None) as e:
        validate_edges(edges)
    assert fragment in str(e.value)


def test_contract10_over_length_samples_are_named():
    with pytest.raises(ConfigError) as e:
        validate_edges([0, 100], lengths=np.array([5, 101, 50, 300]))
    assert "[1, 3]" in str(e.value) and "over_length=truncate" in str(e.value)
