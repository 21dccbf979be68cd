"""The megatron entries' metric gates on real recorded metric series.

The series are the `metrics.jsonl` of real emulated-GPU runs of
`tests/e2e/test_rl_grpo_colocated.py` on this toolkit (numeric scalars kept): the
baseline (three runs, bitwise identical on CPU ranks, so one file stands for all three)
and the same entry with its learning rate planted at half (`--lr 4e-4` for `8e-4`). The
entry's own check (the last rollouts' reward beats the first by MARGIN) passes on the
planted run; the gates declared in ci/suites.py must fail it.
"""

import ast
import statistics
import sys
from pathlib import Path

import pytest
from _ci import REPO

from ci.history.gates import judge
from ci.history.records import AttemptRecord, RunRecord, parse_metrics
from ci.history.store import open_store
from ci.suites import MEGATRON_ENTRIES

NUM_GPUS = 0
DATA = Path(__file__).parent / "data"
ENTRY = next(e for e in MEGATRON_ENTRIES if e.path == "tests/e2e/test_rl_grpo_colocated.py")


def _constants(path: Path) -> dict[str, float]:
    """The entry's own module-level numbers (WINDOW, MARGIN), read without importing it."""
    tree = ast.parse(path.read_text())
    return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name) and t.id in ("WINDOW", "MARGIN")}


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


def test_the_entry_s_own_check_lets_the_halved_learning_rate_through():
    c = _constants(REPO / ENTRY.path)
    window, margin = int(c["WINDOW"]), c["MARGIN"]
    for name in ("baseline", "lr_halved"):
        rewards = [p.value for p in sorted(_series(name), key=lambda p: p.step) if p.name == "rollout/reward"]
        first, last = statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:])
        assert last >= first + margin, (name, first, last)


def test_the_baseline_passes_every_gate(history):
    assert [v.status for v in _verdicts(history, _series("baseline"))] == ["pass"] * len(ENTRY.gates)


def test_the_gates_catch_the_halved_learning_rate(history):
    verdicts = _verdicts(history, _series("lr_halved"))
    failed = [v for v in verdicts if v.status == "fail"]
    assert failed, [v.line for v in verdicts]
    reward = next(v for v in verdicts if v.gate.metric == "rollout/reward")
    assert reward.status == "fail"
    assert reward.line.startswith("metric gate: rollout/reward at step 29 = ")
    assert reward.line.endswith("baseline 0.71875 ± 0 (n=3, emulated; allowed 3σ, floor 0.05)")
    print("\n".join(v.line for v in verdicts))


def test_cuda_runs_are_not_judged_by_emulated_history(history):
    verdicts = _verdicts(history, _series("lr_halved"), hardware="cuda")
    assert {v.status for v in verdicts} == {"inactive"}
    assert verdicts[0].line.endswith("inactive, 0 trusted run(s) on cuda (needs 3)")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
