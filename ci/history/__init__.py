"""Run history: every run of every suite, kept in a database so the next run can use it.

`store` opens it (SQLite by default, PostgreSQL when shared), `rows` are what is
written, `stats` reads it back (estimates, flakes, failure streaks), `metric_gates`
judges e2e metrics against it, `record` reads it before a run and writes it after.
`run_observer` is the one interface through which a run of `python -m ci run` is
observed; `observer` holds the history's observers (the recorder, the metric gates,
the quarantine); `queries` the `history` commands; `ingest` the trust boundary (runs
of pull requests' code exported by their jobs, validated and recorded untrusted by a
trusted one, and the trusted snapshot GPU jobs read); `failure_site` where a failed
test's assertion is, read from its JUnit report when the attempt ends.
"""
