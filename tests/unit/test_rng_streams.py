"""Every RNG stream has its own tag, in one module, and no two streams start in the same state."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np

from pipeline.core import orders
from pipeline.core.orders import (
    EVAL_SUBSET_STREAM,
    HF_MEGABATCH_STREAM,
    INTERLEAVE_STREAM,
    JUMPINESS_BAND_STREAM,
    LHOTSE_STREAM,
    MEGABATCH_STREAM,
    PAIR_REPEAT_STREAM,
    PLAN_STREAMS,
    REPORT_RANDOM_STREAM,
    ROW_STREAM,
    SORTED_ORDER_STREAM,
    STEP_STREAM,
    SYNTHETIC_LENGTHS_STREAM,
    SYNTHETIC_NOISE_STREAM,
    SYNTHETIC_VOCAB_STREAM,
    WINDOW_STREAM,
)

ROOT = Path(__file__).resolve().parents[2]
TAGS = {name: getattr(orders, name) for name in orders.__all__ if name.endswith("_STREAM")}

# Two streams kept from before their tags lived here, whose values the published figures and
# every synthetic corpus depend on. SeedSequence pads entropy with zeros, so (seed, t) draws what
# (seed, epoch t, bucket 0) does: the vocabulary permutation of a corpus is the bucket-0 shuffle
# of epoch 1 when the corpus seed and the plan seed are equal, and bench.packing's pair sample is
# that of epoch 17. Each pairs draws of unrelated computations.
KNOWN = {
    frozenset({"synthetic vocab", "bucket 0 of epoch 1"}),
    frozenset({"pair repeat", "bucket 0 of epoch 17"}),
}


def _streams(seed: int, epochs, buckets):
    """(name, entropy) of every stream the code draws from for one seed: the layouts named in
    pipeline.core.orders, with the report's (seed, epoch) seeds for its non-plan rows."""
    for e in epochs:
        for k in buckets:
            yield f"bucket {k} of epoch {e}", (seed, e, k)
        for name, tag in (
            ("interleave", INTERLEAVE_STREAM),
            ("packed steps", STEP_STREAM),
            ("packed rows", ROW_STREAM),
            ("sorted order", SORTED_ORDER_STREAM),
            ("megabatch", MEGABATCH_STREAM),
            ("lhotse", LHOTSE_STREAM),
            ("report random", REPORT_RANDOM_STREAM),
            ("hf megabatch", HF_MEGABATCH_STREAM),
        ):
            yield f"{name} of epoch {e}", (seed, e, tag)
        yield f"windows of epoch {e}", (seed, e, WINDOW_STREAM)
        for w in (1, 2, 5):  # a windowed epoch's window w: its own shuffles and orders
            for k in buckets:
                yield f"bucket {k} of epoch {e} window {w}", (seed, e, k, WINDOW_STREAM, w)
            for name, tag in (
                ("interleave", INTERLEAVE_STREAM),
                ("packed steps", STEP_STREAM),
                ("packed rows", ROW_STREAM),
            ):
                yield f"{name} of epoch {e} window {w}", (seed, e, tag, WINDOW_STREAM, w)
    yield "report random", (seed, REPORT_RANDOM_STREAM)
    yield "hf megabatch", (seed, HF_MEGABATCH_STREAM)
    yield "pair repeat", (seed, PAIR_REPEAT_STREAM)
    yield "synthetic lengths", (seed, SYNTHETIC_LENGTHS_STREAM)
    yield "synthetic vocab", (seed, SYNTHETIC_VOCAB_STREAM)
    for first, n in ((0, 1), (0, 1000), (4096, 512)):
        yield f"synthetic noise {first}+{n}", (seed, SYNTHETIC_NOISE_STREAM, first, n)


def test_every_tag_is_distinct_and_the_plans_lie_above_every_bucket_index():
    assert len(set(TAGS.values())) == len(TAGS)
    assert set(PLAN_STREAMS) <= set(TAGS.values())
    assert min(PLAN_STREAMS) > 2**20  # bucket indices (the tags of contract 1) stay below


def test_no_two_streams_start_in_the_same_state_over_seeds_epochs_and_buckets():
    state: dict[tuple, str] = {}
    clashes = set()
    streams = [
        ("eval subset", (EVAL_SUBSET_STREAM,)),
        ("jumpiness band", (JUMPINESS_BAND_STREAM,)),
    ]
    for seed in (0, 1, 7):
        streams += [(name, e) for name, e in _streams(seed, range(21), range(64))]
    for name, entropy in streams:
        key = tuple(np.random.SeedSequence(entropy).generate_state(4))
        seed = entropy[0] if len(entropy) > 1 else None
        other = state.setdefault(key, (name, seed))
        if other != (name, seed):
            assert other[1] == seed, (name, other)  # only a seed's own streams can meet
            clashes.add(frozenset({name, other[0]}))
    assert clashes == KNOWN


def _rng_calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "default_rng":
            yield node


def test_no_stream_tag_is_written_outside_pipeline_core_orders():
    """A default_rng seeded with a number written in place is a tag that belongs in orders."""
    files = itertools.chain.from_iterable(
        (ROOT / d).rglob("*.py") for d in ("pipeline", "bench", "jobs")
    )
    found = [
        f"{path.relative_to(ROOT)}:{call.lineno}"
        for path in files
        if path != ROOT / "pipeline/core/orders.py"
        for call in _rng_calls(path)
        for arg in call.args
        for node in ast.walk(arg)
        if isinstance(node, ast.Constant) and isinstance(node.value, int)
    ]
    assert found == []
