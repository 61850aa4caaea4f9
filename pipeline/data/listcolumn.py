"""An Arrow list column (token ids, supervision) seen as numpy: one home for the flattening rule.

Two views, for two kinds of input:

- `values_offsets`: the column's values buffer and each row's offsets into it, zero-copy where
  the column is one chunk (a block, a memory-mapped cache file, a table built by a read). The
  offsets are absolute into the values (a sliced column keeps its parent's values), so row i is
  `values[offsets[i]:offsets[i + 1]]`.
- `flat_values`: the rows' values back to back and each row's length, respecting any slice (a
  column as parquet decoded it, to be checked and re-laid).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["one_array", "values_offsets", "flat_values"]


def one_array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """`col` as one array: its only chunk as is (no copy), else its chunks combined."""
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def values_offsets(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, int64 offsets [rows + 1]) of a list column; see the module docstring."""
    arr = one_array(col)
    return arr.values.to_numpy(), arr.offsets.to_numpy().astype(np.int64, copy=False)


def flat_values(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values of the rows back to back, int64 lengths) of a list column."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return pc.list_flatten(arr).to_numpy(), pc.list_value_length(arr).to_numpy().astype(np.int64)
