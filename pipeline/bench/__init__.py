"""`make bench`: padding, training throughput, training-signal quality and delivery, in one run.

One module per section (`padding`, `training`, `quality`, delivery via `pipeline.bench.delivery`),
`suite` to run them, `render` and `plots` to turn the results dict into BENCHMARKS.md and PNGs.
"""
