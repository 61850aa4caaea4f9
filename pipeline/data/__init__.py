"""Ray Data delivery layer: length index, bucket edges, epoch plans and per-rank batch streams.

The public interface the training loop uses; the pieces live in `index` (scan, cache, contract
10), `epochs` (edges and plans from config) and `feed` (plan-keyed sort, feeder actor, padded
micro-batches). Call from the driver:

    path = resolve_data_path(cfg)
    index = build_length_index(cfg, path)
    edges = resolve_edges(cfg, index.lengths)
    start_feeder(cfg, index, edges, name="bucketray-feeder", path=path)

and inside each Ray Train worker:

    for mb in rank_batches("bucketray-feeder", epoch=e, start_step=s, rank=r, world_size=w): ...
"""

from pipeline.core.epochs import auto_edges, epoch_plan_for, resolve_edges
from pipeline.data.feed import MicroBatch, deliver, rank_batches, start_feeder, stop_feeder
from pipeline.data.index import DataError, LengthIndex, build_length_index, resolve_data_path

__all__ = [
    "DataError",
    "LengthIndex",
    "MicroBatch",
    "auto_edges",
    "build_length_index",
    "deliver",
    "epoch_plan_for",
    "rank_batches",
    "resolve_data_path",
    "resolve_edges",
    "start_feeder",
    "stop_feeder",
]
