"""One builder writes every generated workflow's header, job keys, permissions and first steps:
a pinned action or a runner label changed there changes every file, and no file keeps its own."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.github import job_builder
from ci.github.job_plan import table
from ci.github.workflow import render
from ci.registry.loader import load_registry

NUM_GPUS = 0

WORKFLOWS = ("pr-test.yml", "ci-comment.yml", "run-ci-file.yml", "bisect.yml", "history-ingest.yml")
# The keys of a job, in the one order the builder writes them.
ORDER = ("name", "needs", "if", "runs-on", "permissions", "environment", "concurrency",
         "timeout-minutes", "outputs", "env", "strategy", "steps")


def _rendered(style: Any = None) -> dict[str, str]:
    registry = load_registry(REPO)
    style = style or registry.style
    files = render(table(registry.suites, style, registry.sessions, root=REPO), style)
    return {Path(path).name: text for path, text in files.items() if path.startswith(".github/workflows/")}


def test_every_workflow_is_built_from_the_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Repin checkout and setup-python in the builder alone: every file's steps follow."""
    before = _rendered()
    assert set(before) == set(WORKFLOWS)
    monkeypatch.setattr(job_builder, "CHECKOUT", ("actions/checkout", "c" * 40, "v9"))
    monkeypatch.setattr(job_builder, "SETUP_PYTHON", ("actions/setup-python", "d" * 40, "v9"))
    after = _rendered()
    for name in WORKFLOWS:
        old = [line for line in before[name].splitlines() if "actions/checkout@" in line]
        new = [line for line in after[name].splitlines() if "actions/checkout@" in line]
        assert old, name  # every workflow checks out somewhere
        assert len(new) == len(old) and all(f"@{'c' * 40}  # v9" in line for line in new), name
        pythons = [line for line in after[name].splitlines() if "actions/setup-python@" in line]
        assert pythons and all("d" * 40 in line for line in pythons), name


def test_every_job_lists_its_keys_in_one_order_and_checks_out_without_the_token() -> None:
    files = _rendered()
    checkouts = 0
    for name, text in files.items():
        parsed = yaml.safe_load(text)
        assert parsed["permissions"] == {}, name  # each job grants its own
        for job_id, job in parsed["jobs"].items():
            keys = list(job)
            assert keys == sorted(keys, key=ORDER.index), (name, job_id, keys)
            for step in job["steps"]:
                if str(step.get("uses", "")).startswith("actions/checkout@"):
                    checkouts += 1
                    assert step["with"]["persist-credentials"] is False, (name, job_id)
    assert checkouts >= 20  # pr-test's jobs, the gateway's, run-ci-file's, the bisect's, the ingest's


def test_a_hosted_runner_of_several_labels_reaches_every_hosted_job() -> None:
    """The style's hosted labels, all of them, in every workflow (bisect.yml, history-ingest.yml
    and the gateway's took the first label alone before the builder)."""
    style = dataclasses.replace(load_registry(REPO).style, hosted_runner=("ubuntu-latest", "large"))
    hosted = 0
    for name, text in _rendered(style).items():
        for job_id, job in yaml.safe_load(text)["jobs"].items():
            labels = job["runs-on"]
            if labels == "ubuntu-latest" or "self-hosted" not in labels:
                assert labels == ["ubuntu-latest", "large"], (name, job_id, labels)
                hosted += 1
    assert hosted >= 12


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
