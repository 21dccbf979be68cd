"""Fixtures the toolkit's history tests share: a real PostgreSQL server, and a store URL on
each backend (SQLite and PostgreSQL) so one test covers both; and the `nightly` marker's rule."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _postgres import fresh_database, server


@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    """`.ci/run`'s server, or one started for this module; the tests skip, saying why, without."""
    try:
        with server() as url:
            yield url
    except RuntimeError as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store: a SQLite file, then a fresh database on the PostgreSQL server."""
    from ci.history.store import normalise

    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.sqlite'}"
    return normalise(fresh_database(request.getfixturevalue("pg_server")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A `nightly` test runs only where the marker expression names it (`-m nightly`: the
    nightly job's actions_real session); every other run, the gate's toolkit suite among them,
    deselects it and says so in pytest's summary."""
    if "nightly" in (config.option.markexpr or ""):
        return
    nightly = [item for item in items if item.get_closest_marker("nightly") is not None]
    if nightly:
        config.hook.pytest_deselected(items=nightly)
        items[:] = [item for item in items if item.get_closest_marker("nightly") is None]
