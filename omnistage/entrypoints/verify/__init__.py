"""`omnistage verify`: the project's equivalence proof run on a user's model or pipeline.

sync ≡ async ≡ speculative ≡ alone-vs-batched on a seeded workload, stage payloads
equal, nothing leaked (see `docs/verify.md`). `command` owns the command line,
`workload` the requests, `text_runs` / `pipeline_runs` the engines, `checks` the
comparison and `report` the table.
"""
