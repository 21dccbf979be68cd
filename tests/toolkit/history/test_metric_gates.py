"""The megatron entries' metric gates on real recorded metric series.

The series is the `metrics.jsonl` of real emulated-GPU runs of
`tests/e2e/test_rl_grpo_colocated.py` on this toolkit (numeric scalars kept): three runs,
bitwise identical on CPU ranks, so one file stands for all three. The gates declared in
ci/registry/repo_suites.py must pass it, name every metric it writes, and fail a drift past their floor.
"""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ci.history.metric_gates import judge
from ci.history.rows import AttemptRecord, RunRecord, parse_metrics
from ci.history.store import open_store
from ci.registry.repo_suites import MEGATRON_ENTRIES

NUM_GPUS = 0
DATA = Path(__file__).resolve().parents[1] / "data"
ENTRY = next(e for e in MEGATRON_ENTRIES if e.path == "tests/e2e/test_rl_grpo_colocated.py")


def _series(name: str):
    return parse_metrics(ENTRY.id, (DATA / f"grpo_colocated.{name}.metrics.jsonl").read_text())


@pytest.fixture
def history(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'h.sqlite'}")
    base = _series("baseline")
    for n in range(3):
        store.record(RunRecord(uid=f"base{n}", suite="megatron", hardware="emulated", started_at=n,
                               ended_at=n + 1, exit_code=0, metrics=base, attempts=(
            AttemptRecord(entry_id=ENTRY.id, path=ENTRY.path, attempt=1, final=True,
                          outcome="passed", seconds=70.0),)))
    yield store
    store.close()


def _verdicts(store, points, hardware="emulated"):
    rows = store.metric_series(ENTRY.id, hardware=hardware, names=[g.metric for g in ENTRY.gates])
    return [judge(ENTRY.id, g, points, rows, hardware=hardware) for g in ENTRY.gates]


def test_the_baseline_passes_every_gate(history):
    assert [v.status for v in _verdicts(history, _series("baseline"))] == ["pass"] * len(ENTRY.gates)


def test_a_gate_naming_a_missing_metric_says_which_registry_to_fix():
    """In an adopting repository the registry is .slime-ci/suites.py; the line names that file."""
    for registry in ("ci/registry/repo_suites.py", ".slime-ci/suites.py"):
        verdict = judge(ENTRY.id, ENTRY.gates[0], (), (), hardware="emulated", registry=registry)
        assert verdict.status == "error" and verdict.line.endswith(f"fix its gate in {registry}")


def test_a_run_that_drifts_past_a_floor_fails_with_one_line(history):
    """The last reward 0.1 below the baseline (twice the floor): the reward gate names it."""
    base = _series("baseline")
    last = max(p.step for p in base)
    drifted = tuple(replace(p, value=p.value - 0.1) if p.name == "rollout/reward" and p.step == last else p
                    for p in base)
    verdicts = {v.gate.metric: v for v in _verdicts(history, drifted)}
    assert verdicts["rollout/reward"].status == "fail"
    assert verdicts["rollout/reward"].line == (
        "metric gate: rollout/reward at step 29 = 0.61875, baseline 0.71875 ± 0 "
        "(n=3, emulated; allowed 3σ, floor 0.05)")
    assert verdicts["train/grad_norm"].status == "pass"


def test_cuda_runs_are_not_judged_by_emulated_history(history):
    verdicts = _verdicts(history, _series("baseline"), hardware="cuda")
    assert {v.status for v in verdicts} == {"inactive"}
    assert verdicts[0].line.endswith("inactive, 0 trusted run(s) on cuda (needs 3)")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
