"""Ray Data delivery layer: length index, bucket edges, epoch plans and per-rank batch streams.

The public interface the training loop uses. Call from the driver:

    path = resolve_data_path(cfg)
    index = build_length_index(cfg, path)
    edges = resolve_edges(cfg, index.lengths)
    start_feeder(cfg, index, edges, name="bucketray-feeder", path=path)

and inside each Ray Train worker:

    for mb in rank_batches("bucketray-feeder", epoch=e, start_step=s, rank=r, world_size=w,
                           plan_hash=h): ...

`stop_feeder(name)` releases the feeder and its blocks. The modules, one job each:

- `index`: the length index (scan, validation and quarantine of contract 10, cache);
- `pipeline.core.epochs`: edges and epoch plans from the config (pure, re-exported here);
- `feeder`: the feeder actor: per-epoch plan-keyed sort and split, prefetch of epoch e+1,
  failed preparations prepared again, restarted by Ray if its process dies;
- `read`: the Ray Data read task: planned rows of a row group, checked, keyed;
- `retry`: which storage errors are transient, and the backoff loop that retries them;
- `protocol`: `RankPart`, what the feeder hands a worker, and its checks (plan hash);
- `stream`: `rank_batches`, the worker's side of the feeder (survives a feeder restart);
- `rechunk`: `deliver` and `MicroBatch`, re-chunking and padding without Ray.
"""

from pipeline.core.epochs import auto_edges, epoch_plan_for, resolve_edges
from pipeline.data.feeder import start_feeder, stop_feeder
from pipeline.data.index import DataError, LengthIndex, build_length_index, resolve_data_path
from pipeline.data.protocol import PlanMismatchError, RankPart
from pipeline.data.rechunk import MicroBatch, deliver
from pipeline.data.retry import RetryPolicy, StorageUnavailableError
from pipeline.data.stream import FeederLostError, rank_batches

__all__ = [
    "DataError",
    "FeederLostError",
    "LengthIndex",
    "MicroBatch",
    "PlanMismatchError",
    "RankPart",
    "RetryPolicy",
    "StorageUnavailableError",
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
