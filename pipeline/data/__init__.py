"""Data delivery layer: length index, bucket edges, epoch plans and per-rank batch streams.

The public interface the training loop uses. Call from the driver:

    path = resolve_data_path(cfg)
    index = build_length_index(cfg, path)
    edges = resolve_edges(cfg, index.lengths)
    start_feeder(cfg, index, edges, name="bucketray-feeder", path=path)

and inside each Ray Train worker:

    for mb in rank_batches("bucketray-feeder", epoch=e, start_step=s, rank=r, world_size=w,
                           plan_hash=h): ...

`stop_feeder(name)` releases the feeder and its blocks (`api` wraps all of this for your own
training loop). The modules, one job each:

- `source`, `fs`, `scan`, `footer`, `cache`, `validate`, `index`: the length index (shard
  discovery, the scan, validation and quarantine of contract 10, the index cache);
- `pipeline.core.epochs`: edges and epoch plans from the config (pure, re-exported here);
- `pipeline.core.ranges`: which range of an epoch each request is served (chapters, lead-ins;
  pure);
- `feeder`: the feeder actor: schedules each range's preparation, hands out the ranks' parts,
  prepares ahead, frees what every rank has passed, restarted by Ray if its process dies;
- `prepare`: how a range is read (row cache, a read in the feeder, or a Ray Data pass) and
  what that took (`RangeStats`);
- `read`: a row group's planned rows, checked against the index and the model, keyed;
- `rowcache`: each row group's checked rows, decoded once, memory-mapped on the feeder's node;
- `gather`: a range's rows copied in key order into the feeder's own blocks;
- `sort_pass`: the Ray Data pass that sorts a range by key across the cluster;
- `listcolumn`: an Arrow list column as numpy values and offsets;
- `retry`: which storage errors are transient, and the backoff loop that retries them;
- `protocol`: `RankPart`, what the feeder hands a worker, and its checks (plan hash);
- `stream`: `rank_batches`, the worker's side of the feeder (survives a feeder restart);
- `rechunk`: `deliver` and `MicroBatch`, re-chunking and padding without Ray;
- `tokenize`: your own text into parquet shards; `connect`: which Ray cluster to join.
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
