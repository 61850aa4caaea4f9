"""The benchmarks: one script per question, each writing `benchmarks/<question>.json` and its
plots (`python -m bench.padding`, `training`, `packed`, `delivery`, `outcome`,
`eval_modes`), their shared plumbing (`common`: command line, machine, JSON; `runs`: a training
run's figures; `probes`: memory probes; `plots`) and `tables`, which writes BENCHMARKS.md's
tables and the README's headline blocks from that JSON (`table_blocks`, `outcome_blocks`;
`make bench-render`).

A package beside `pipeline`, not inside it: the runtime never imports it (a test checks that),
and of `jobs` only the benchmark commands (`bench_data`, `sizing`) do.
"""
