"""The plan and the generated workflow agree, for every label combination.

The workflow's `if:` and concurrency expressions are evaluated here by a small
evaluator of the Actions expression subset the generator emits (literals,
property paths with `.*`, `!`, `==`, `!=`, `&&`, `||`, `contains`, `format`),
with Actions' semantics: `&&`/`||` return an operand, string comparison
ignores case, a missing property is null.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import pytest
import yaml

from ci.github.job_plan import (
    PLAN_JOB,
    Event,
    Job,
    condition,
    decide,
    gating_labels,
    table,
)
from ci.github.workflow import WORKFLOW_PATH, render
from ci.registry import Suite
from ci.registry.repo_suites import SUITES
from ci.registry.workflow_style import Style

NUM_GPUS = 0

REPO = "slime-ci/slime"
PR_NUMBER = 42

# --- expression evaluator -----------------------------------------------------------------------

_TOKEN = re.compile(r"""\s*(?:
    (?P<num>\d+)
  | (?P<str>'(?:[^']|'')*')
  | (?P<op>==|!=|&&|\|\||!|\(|\)|,|\.\*|\.)
  | (?P<name>[A-Za-z_][A-Za-z0-9_-]*)
)""", re.VERBOSE)

Value = Any
Expr = Callable[[dict[str, Value]], Value]


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise SyntaxError(f"cannot read {text[pos:]!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _truthy(v: Value) -> bool:
    return v not in (None, False, 0, "")


def _eq(a: Value, b: Value) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.casefold() == b.casefold()
    return bool(a == b) and type(a) is type(b)


def _text(v: Value) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _format(fmt: str, *args: Value) -> str:
    return re.sub(r"\{(\d+)\}", lambda m: _text(args[int(m.group(1))]), fmt)


def _contains(haystack: Value, needle: Value) -> bool:
    if isinstance(haystack, list):
        return any(_eq(x, needle) for x in haystack)
    return isinstance(haystack, str) and _text(needle).casefold() in haystack.casefold()


def _from_json(text: Value) -> Value:
    if not isinstance(text, str) or not text:
        raise ValueError(f"fromJSON({text!r}): Actions fails the expression")  # as Actions does
    return json.loads(text)


# A run's jobs are never cancelled here: `cancelled()` is false, as in a run that goes on.
_FUNCTIONS: dict[str, Callable[..., Value]] = {"contains": _contains, "format": _format,
                                               "fromJSON": _from_json, "cancelled": lambda: False}


def _member(value: Value, name: str) -> Value:
    if isinstance(value, list):  # after `.*`: project every element
        return [_member(v, name) for v in value]
    return value.get(name) if isinstance(value, dict) else None


def _either(left: Expr, right: Expr) -> Expr:
    def run(c: dict[str, Value]) -> Value:
        value = left(c)
        return value if _truthy(value) else right(c)
    return run


def _both(left: Expr, right: Expr) -> Expr:
    def run(c: dict[str, Value]) -> Value:
        value = left(c)
        return right(c) if _truthy(value) else value
    return run


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        tok = self.toks[self.i]
        if expected is not None and tok[1] != expected:
            raise SyntaxError(f"expected {expected!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> Expr:
        node = self.or_()
        if self.i != len(self.toks):
            raise SyntaxError(f"trailing {self.toks[self.i:]}")
        return node

    def or_(self) -> Expr:
        node = self.and_()
        while self.peek() == "||":
            self.take()
            node = _either(node, self.and_())
        return node

    def and_(self) -> Expr:
        node = self.cmp()
        while self.peek() == "&&":
            self.take()
            node = _both(node, self.cmp())
        return node

    def cmp(self) -> Expr:
        node = self.unary()
        if self.peek() in ("==", "!="):
            op = self.take()[1]
            left, right = node, self.unary()
            if op == "==":
                return lambda c: _eq(left(c), right(c))
            return lambda c: not _eq(left(c), right(c))
        return node

    def unary(self) -> Expr:
        if self.peek() == "!":
            self.take()
            inner = self.unary()
            return lambda c: not _truthy(inner(c))
        return self.primary()

    def primary(self) -> Expr:
        kind, text = self.take()
        if text == "(":
            node = self.or_()
            self.take(")")
            return node
        if kind == "num":
            return lambda c: int(text)
        if kind == "str":
            value = text[1:-1].replace("''", "'")
            return lambda c: value
        if kind != "name":
            raise SyntaxError(f"unexpected {text!r}")
        if text in ("true", "false", "null"):
            const = {"true": True, "false": False, "null": None}[text]
            return lambda c: const
        if self.peek() == "(":
            self.take()
            args: list[Expr] = []
            while self.peek() != ")":
                args.append(self.or_())
                if self.peek() == ",":
                    self.take()
            self.take(")")
            fn = _FUNCTIONS[text]
            return lambda c: fn(*(a(c) for a in args))
        steps: list[str] = []
        while self.peek() in (".", ".*"):
            op = self.take()[1]
            steps.append("*" if op == ".*" else self.take()[1])
        root = text

        def path(c: dict[str, Value]) -> Value:
            value = c.get(root)
            for step in steps:
                if step == "*":
                    value = list(value.values()) if isinstance(value, dict) else (value or [])
                else:
                    value = _member(value, step)
            return value
        return path


@cache
def compile_expr(text: str) -> Expr:
    return _Parser(text).parse()


def evaluate(text: str, ctx: dict[str, Value]) -> Value:
    """An `if:` value (a bare expression, or one `${{ }}`)."""
    text = text.strip()
    m = re.fullmatch(r"\$\{\{(.*)\}\}", text, re.DOTALL)
    return compile_expr(m.group(1) if m else text)(ctx)


@cache
def _template(template: str) -> list[str | Expr]:
    parts = re.split(r"\$\{\{(.*?)\}\}", template, flags=re.DOTALL)
    # re.split puts the captured expressions at odd positions.
    return [compile_expr(p) if i % 2 else p for i, p in enumerate(parts)]


def interpolate(template: str, ctx: dict[str, Value]) -> str:
    """A string value with `${{ }}` parts (a concurrency group)."""
    return "".join(p if isinstance(p, str) else _text(p(ctx)) for p in _template(template))


def context(event: Event, *, run_id: int, number: int = PR_NUMBER,
            matrix: dict[str, Value] | None = None,
            infinite_run: bool | None = None, plan: str | None = None) -> dict[str, Value]:
    """The Actions contexts for an event, as GitHub would fill them; `plan` is what the plan
    job published (default: what `decide` says, on pull requests; the job is skipped otherwise)."""
    payload: dict[str, Value] = {}
    inputs: dict[str, Value] = {}
    if event.name == "pull_request":
        head = "someone/slime" if event.from_fork else REPO
        payload = {"action": event.action, "number": number, "pull_request": {
            "number": number,
            "labels": [{"name": x, "color": "ededed"} for x in sorted(event.labels)],
            "head": {"ref": "feature", "repo": {"full_name": head}},
        }}
        if event.added is not None:
            payload["label"] = {"name": event.added}
    elif event.name == "schedule":
        payload = {"schedule": event.cron}
    elif event.name == "workflow_dispatch":
        inputs = {"infinite_run": bool(infinite_run)}
        payload = {"inputs": inputs}
    else:
        payload = {"ref": "refs/heads/main"}
    github = {"event_name": event.name, "repository": REPO, "run_id": run_id, "event": payload}
    if event.name == "pull_request":
        published = plan if plan is not None else json.dumps(
            [j.id for j in table() if decide(j, event).runs])
        needs = {PLAN_JOB: {"result": "success", "outputs": {"jobs": published}}}
    else:
        needs = {PLAN_JOB: {"result": "skipped", "outputs": {}}}
    return {"github": github, "inputs": inputs, "matrix": matrix or {}, "needs": needs}


# --- scenarios ----------------------------------------------------------------------------------

def _subsets(items: list[str]) -> Iterator[frozenset[str]]:
    for r in range(len(items) + 1):
        for combo in itertools.combinations(items, r):
            yield frozenset(combo)


def scenarios(jobs: tuple[Job, ...]) -> Iterator[Event]:
    """push, dispatch, and every PR activity for every combination of labels (+ an unrelated one)."""
    yield Event(name="push")
    yield Event(name="workflow_dispatch")
    for cron, cadence in Style().schedules.items():
        yield Event(name="schedule", cron=cron, cadence=cadence)
    yield Event(name="schedule", cron="5 5 5 5 5", cadence="none")  # a cron of no job
    universe = [*gating_labels(jobs), "documentation"]
    for labels in _subsets(universe):
        for fork in (False, True):
            for action in ("opened", "synchronize", "reopened"):
                yield Event(name="pull_request", action=action, labels=labels, from_fork=fork)
            for added in sorted(labels):
                yield Event(name="pull_request", action="labeled", labels=labels,
                            added=added, from_fork=fork)
            # A docs-only diff: the plan job publishes no GPU job, and the workflow obeys it.
            yield Event(name="pull_request", action="synchronize", labels=labels, from_fork=fork,
                        gpu_skip="the diff touches only GPU-irrelevant paths")


def _workflow(jobs: tuple[Job, ...]) -> dict[str, Any]:
    parsed: dict[str, Any] = yaml.safe_load(render(jobs)[WORKFLOW_PATH])
    return parsed


def _matrices(job: Job) -> list[dict[str, Value]]:
    return [{"shard": i} for i in range(1, job.shards + 1)] if job.shards > 1 else [{}]


SHARDED: tuple[Suite, ...] = tuple(
    Suite(name=s.name, tier=s.tier, purpose=s.purpose, profile=s.profile, label=s.label,
          shards=3 if s.name == "megatron" else s.shards)
    for s in SUITES
)


def test_plan_and_workflow_conditions_agree_for_every_label_combination() -> None:
    jobs = table()
    wf = _workflow(jobs)
    checked = 0
    for event in scenarios(jobs):
        ctx = context(event, run_id=1000)
        for job in jobs:
            spec = wf["jobs"][job.id]
            assert spec["if"] == condition(job)
            planned = decide(job, event).runs
            actual = _truthy(evaluate(spec["if"], ctx))
            assert planned == actual, (job.id, event)
            checked += 1
    # 128 label sets x 2 origins x (3 + k labeled) + push + dispatch, per job
    assert checked > 1500 * len(jobs)


def test_workflow_only_triggers_on_the_events_the_plan_models() -> None:
    wf = _workflow(table())
    on = wf["on"]
    assert set(on) == {"pull_request", "push", "workflow_dispatch", "schedule"}
    assert [s["cron"] for s in on["schedule"]] == list(Style().schedules)
    assert "pull_request_target" not in on
    assert on["pull_request"]["types"] == ["opened", "synchronize", "reopened", "labeled"]
    assert on["pull_request"]["branches"] == on["push"]["branches"] == ["main"]


def test_spot_checks_of_the_evaluator_against_known_actions_semantics() -> None:
    ctx = {"github": {"event": {"pull_request": {"labels": [{"name": "Run-CI-Megatron"}]}},
                      "run_id": 7}}
    assert evaluate("contains(github.event.pull_request.labels.*.name, 'run-ci-megatron')", ctx)
    assert not evaluate("contains(github.event.pull_request.labels.*.name, 'run-ci')", ctx)
    assert evaluate("github.nothing.here", ctx) is None
    assert evaluate("github.nothing && 'a' || 'b'", ctx) == "b"
    assert evaluate("!github.nothing && 'a' || 'b'", ctx) == "a"
    assert evaluate("'It''s' == 'IT''S'", ctx) is True
    assert interpolate("x-${{ format('run{0}', github.run_id) }}-y", ctx) == "x-run7-y"
    with pytest.raises(SyntaxError):
        evaluate("github.event_name === 'push'", ctx)


def _group(job: Job, wf: dict[str, Any], event: Event, run_id: int,
           matrix: dict[str, Value], number: int = PR_NUMBER) -> str:
    spec = wf["jobs"][job.id]["concurrency"]
    assert spec["cancel-in-progress"] is True
    return interpolate(spec["group"], context(event, run_id=run_id, matrix=matrix, number=number))


def test_a_later_event_cancels_a_running_job_only_when_it_reruns_that_job() -> None:
    jobs = table(SHARDED)  # the registry, with one sharded (matrix) job
    wf = _workflow(jobs)
    events = list(scenarios(jobs))
    contexts = [context(e, run_id=2000 + i) for i, e in enumerate(events)]
    for job in jobs:
        template = wf["jobs"][job.id]["concurrency"]["group"]
        assert wf["jobs"][job.id]["concurrency"]["cancel-in-progress"] is True
        runs = [e.name == "pull_request" and decide(job, e).runs for e in events]
        for matrix in _matrices(job):
            # Each event is a separate run; two runs' jobs cancel each other iff their groups match.
            slots: set[str] = set()
            others: list[str] = []
            for ctx, in_slot in zip(contexts, runs, strict=True):
                group = interpolate(template, {**ctx, "matrix": matrix})
                (slots.add if in_slot else others.append)(group)
            # Every PR event that runs the job lands in the one slot of this PR (and shard), so
            # it cancels the job of the previous commit; every other event -- one that skips
            # the job, a push, a dispatch -- has a group of its own and cancels nothing.
            assert len(slots) == (1 if any(runs) else 0), (job.id, slots)
            assert not slots & set(others)
            assert len(set(others)) == len(others)


def test_an_unrelated_label_never_cancels_a_running_gpu_job() -> None:
    jobs = table()
    wf = _workflow(jobs)
    megatron = next(j for j in jobs if j.id == "megatron")
    commit = Event(name="pull_request", action="synchronize",
                   labels=frozenset({"run-ci-megatron"}))
    assert decide(megatron, commit).runs
    running = _group(megatron, wf, commit, run_id=1, matrix={})
    assert running == f"pr-test-pr{PR_NUMBER}-megatron"
    for added in ("documentation", "run-ci-ckpt"):
        labeled = Event(name="pull_request", action="labeled", added=added,
                        labels=frozenset({"run-ci-megatron", added}))
        assert _group(megatron, wf, labeled, run_id=2, matrix={}) != running
    # A new commit does cancel it, and so does re-adding its own label (a deliberate re-run).
    assert _group(megatron, wf, commit, run_id=3, matrix={}) == running
    readd = Event(name="pull_request", action="labeled", added="run-ci-megatron",
                  labels=frozenset({"run-ci-megatron"}))
    assert _group(megatron, wf, readd, run_id=4, matrix={}) == running
    # Another PR, a push and a dispatch never share its slot.
    assert _group(megatron, wf, commit, run_id=5, matrix={}, number=43) != running
    for other in (Event(name="push"), Event(name="workflow_dispatch")):
        assert _group(megatron, wf, other, run_id=6, matrix={}) == "pr-test-run6-megatron"


def test_shards_get_their_own_concurrency_slot() -> None:
    jobs = table(SHARDED)
    wf = _workflow(jobs)
    megatron = next(j for j in jobs if j.id == "megatron")
    commit = Event(name="pull_request", labels=frozenset({"run-ci-megatron"}))
    slots = {_group(megatron, wf, commit, run_id=1, matrix=m) for m in _matrices(megatron)}
    assert slots == {f"pr-test-pr{PR_NUMBER}-megatron-{i}" for i in (1, 2, 3)}


def _nox_step(wf: dict, job_id: str) -> dict:
    """The step of a job that runs its nox session (cache steps may follow it)."""
    return next(s for s in wf["jobs"][job_id]["steps"] if "nox " in s.get("run", ""))


@pytest.mark.parametrize(("infinite_run", "event_name", "expected"), [
    (True, "workflow_dispatch", "1"),
    (False, "workflow_dispatch", "0"),
    (None, "pull_request", "0"),
])
def test_infinite_run_input_reaches_gpu_jobs_as_an_env_var(
        infinite_run: bool | None, event_name: str, expected: str) -> None:
    jobs = table()
    wf = _workflow(jobs)
    event = Event(name=event_name, labels=frozenset(gating_labels(jobs))
                  if event_name == "pull_request" else frozenset())  # type: ignore[arg-type]
    ctx = context(event, run_id=1, infinite_run=infinite_run)
    gpu = [j for j in jobs if j.self_hosted and not j.infinite]
    assert gpu
    for job in jobs:
        if job.infinite:  # the weekly stability job is the infinite mode, whatever the event
            assert _nox_step(wf, job.id)["env"]["SLIME_TEST_ENABLE_INFINITE_RUN"] == "1"
    for job in gpu:
        env = _nox_step(wf, job.id)["env"]
        assert interpolate(env["SLIME_TEST_ENABLE_INFINITE_RUN"], ctx) == expected
    for job in jobs:
        if not job.self_hosted:
            assert "SLIME_TEST_ENABLE_INFINITE_RUN" not in _nox_step(wf, job.id).get("env", {})


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
