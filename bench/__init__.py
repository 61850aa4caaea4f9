"""`make bench`: padding, training throughput, training-signal quality and delivery, in one run.

One module per section (`padding`, `training`, `quality`, delivery via `bench.delivery`),
`suite` to run them, `render` and `plots` to turn the results dict into BENCHMARKS.md and PNGs.
The offline analysis behind `jobs.plan_buckets` lives here too: `report` (the bucket report),
`policies` (the batching policies it scores), `peers` (other libraries' samplers simulated),
`hf_peers` (Hugging Face's own samplers), `report_text` and `report_plot`.

A package beside `pipeline`, not inside it: the runtime never imports it (a test checks that),
and only `jobs` and the tests do.
"""
