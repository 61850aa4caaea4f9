"""Pure planning core: bucket edges, epoch plans, collation, metric math, config.

Imports no Ray, torch, pyarrow or matplotlib: it writes no files and draws nothing.
"""
