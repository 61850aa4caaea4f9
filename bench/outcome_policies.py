"""The outcome benchmark's policies (`bench.outcome`): each one's overrides of the demo config,
and its label in the tables and the plot."""

from __future__ import annotations

__all__ = ["LABELS", "POLICIES", "ROW_GROUP_ROWS"]

# name -> overrides of the demo config; the first is the time reference.
POLICIES = {
    "sorted": ["plan.policy=sorted", "buckets.edges=[0,{top}]"],
    "random": ["plan.policy=random", "buckets.edges=[0,{top}]"],
    "megabatch": ["plan.policy=megabatch", "buckets.edges=[0,{top}]"],
    "sorted_ascending": ["plan.policy=sorted_ascending", "buckets.edges=[0,{top}]"],
    "team": ["buckets.edges={team}"],
    "bucketed": ["buckets.num_buckets=8"],  # the demo's former default
    "auto": ["buckets.num_buckets=auto"],
    "packed": [
        "batching.mode=packed",
        "batching.row_tokens=2048",
        "batching.rows_per_step=8",
        "buckets.num_buckets=auto",
    ],
    # Windows of about a quarter and a sixteenth of the training tokens, over row groups of
    # `ROW_GROUP_ROWS` consecutive samples (`pipeline.core.windows`).
    "auto_w4": ["buckets.num_buckets=auto", "plan.window_tokens={w4}"],
    "auto_w16": ["buckets.num_buckets=auto", "plan.window_tokens={w16}"],
    "packed_w16": [
        "batching.mode=packed",
        "batching.row_tokens=2048",
        "batching.rows_per_step=8",
        "buckets.num_buckets=auto",
        "plan.window_tokens={w16}",
    ],
}
# The windowed policies' row groups: this many consecutive training samples (in sample-id order,
# so neighbouring definitions of one module share a row group, as a tokenized corpus's would).
ROW_GROUP_ROWS = 64
LABELS = {
    "sorted": "sorted-static (fixed batches, order shuffled)",
    "random": "random",
    "megabatch": "megabatch (HF group_by_length)",
    "sorted_ascending": "sorted, shortest first every epoch",
    "team": "team's six edges (scaled)",
    "bucketed": "bucketed, 8 optimal edges",
    "auto": "bucketed, auto edges",
    "packed": "packed rows (2,048 x 8; the demo default)",
    "auto_w4": "bucketed, auto edges, 4 windows",
    "auto_w16": "bucketed, auto edges, 16 windows",
    "packed_w16": "packed rows, 16 windows",
}
