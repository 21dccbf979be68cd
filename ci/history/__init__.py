"""Run history: every run of every suite, kept in a database so the next run can use it.

`store` opens it (SQLite by default, PostgreSQL when shared), `records` are what is
written, `stats` reads it back (estimates, flakes, failure streaks), `gates` judges
e2e metrics against it, `record` is the runner's end-of-run hook, `cli` the commands.
"""
