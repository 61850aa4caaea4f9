"""The bucket report: how one set of sample lengths batches under each policy, offline.

What `jobs.plan_buckets` prints and the padding benchmarks score: `build` (the report dict: the
chosen edges, their epoch plan, per-bucket sizes, the policy table, the packed epoch), `policies`
(every batching policy scored by simulated padding), `peers` (other libraries' samplers,
simulated in numpy), `text` (the plain-text report) and `plot` (PNGs). Pure numpy on
`pipeline.core`; `plot` imports matplotlib and `hf_peers` (Hugging Face's own samplers, an
optional extra) imports transformers, each inside its functions.
"""
