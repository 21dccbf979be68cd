"""The layout holds: no import circle, no import running down the layer order that
docs/architecture.md states, test files that mirror the code, one meaning per file name.

Imports are read with `ast` (nothing is imported), deferred ones inside functions and
`TYPE_CHECKING` blocks included: a circle or an upward import hidden behind them still ties
two layers into one. `ci.cli` reaches its commands through `"module:function"` strings in
its SUBCOMMANDS table; those count as imports too.
"""

import ast
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helpers, also standalone
from _ci import REPO

NUM_GPUS = 0

ARCHITECTURE = REPO / "docs" / "architecture.md"
LAYERS_BEGIN = "<!-- layers:"
LAYERS_END = "<!-- /layers -->"


def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _string_targets(tree: ast.AST, modules: Mapping[str, Path]) -> set[str]:
    """Modules named by `"pkg.module:function"` strings (a lazy command table)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = re.fullmatch(r"(ci(?:\.\w+)+):\w+", node.value)
            if match and match.group(1) in modules:
                found.add(match.group(1))
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of `ci` it imports (anywhere in its body)."""
    modules = {_module(p, root): p for p in sorted((root / "ci").rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found: set[str] = _string_targets(tree, modules)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pkg import mod` imports the module; `from pkg import name`, the package.
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [s for s in subs if s in modules]
                if len(targets) < len(subs):
                    targets.append(base)
            for target in targets:
                if target in modules and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the list of modules around it; None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def node_of(module: str) -> str:
    """The node a module belongs to: its subpackage of `ci` (ci.gpu), or itself at the top."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with every subpackage of `ci` (ci.backends, ci.history…) one node."""
    merged: dict[str, set[str]] = {}
    for name, targets in graph.items():
        here = node_of(name)
        merged.setdefault(here, set()).update(t for t in map(node_of, targets) if t != here)
    # A package's own __init__ and its modules are one node; `ci` itself stays out of it.
    return {k: {t for t in v if t != "ci"} for k, v in merged.items() if k != "ci"}


def read_layers(text: str) -> dict[str, int]:
    """Node -> its layer, from the table between the layer markers of docs/architecture.md."""
    if LAYERS_BEGIN not in text or LAYERS_END not in text:
        raise ValueError(f"no layer table ({LAYERS_BEGIN} … {LAYERS_END})")
    block = text.split(LAYERS_BEGIN, 1)[1].split(LAYERS_END, 1)[0]
    layers: dict[str, int] = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        for node in re.findall(r"`([\w.]+)`", cells[1]):
            if node in layers:
                raise ValueError(f"{node} is in layer {layers[node]} and layer {cells[0]}")
            layers[node] = int(cells[0])
    return layers


def upward_imports(packages: dict[str, set[str]], layers: Mapping[str, int]) -> list[str]:
    """Every edge from a node to one of a higher layer, as 'a (layer) -> b (layer)'."""
    return sorted(f"{a} (layer {layers[a]}) -> {b} (layer {layers[b]})"
                  for a, targets in packages.items() for b in targets
                  if a in layers and b in layers and layers[b] > layers[a])


def test_ci_has_no_import_cycle():
    graph = import_graph(REPO)
    assert "ci.run.pipeline" in graph and "ci.run.runner" in graph["ci.run.pipeline"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())


def test_ci_packages_have_no_import_cycle():
    packages = package_graph(import_graph(REPO))
    assert "ci.backends" in packages and "ci.backends" in packages["ci.run"]
    cycle = find_cycle(packages)
    assert cycle is None, "import circle between packages: " + " -> ".join(cycle or ())


def test_every_node_has_a_layer_and_no_import_runs_upward():
    layers = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    packages = package_graph(import_graph(REPO))
    unplaced = sorted(set(packages) - set(layers))
    assert not unplaced, f"not in the layer table of docs/architecture.md: {unplaced}"
    gone = sorted(set(layers) - set(packages))
    assert not gone, f"the layer table names what ci/ does not have: {gone}"
    upward = upward_imports(packages, layers)
    assert not upward, "imports that run upward (docs/architecture.md, The layers): " + "; ".join(upward)


def test_the_command_table_counts_as_imports():
    graph = import_graph(REPO)
    assert {"ci.run.command", "ci.gpu.lock_gpus", "ci.github.job_plan"} <= graph["ci.cli"]


def test_the_top_level_keeps_the_entry_point_and_shared_leaves():
    top = sorted(p.name for p in (REPO / "ci").glob("*.py"))
    assert len(top) <= 15, top


def test_no_two_modules_share_a_file_name():
    seen: dict[str, list[str]] = {}
    for path in (REPO / "ci").rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / "ci" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ci" / rel).write_text(text)
    return tmp_path


def test_the_check_names_an_upward_import(tmp_path):
    root = _tree(tmp_path, {"__init__.py": "", "low/__init__.py": "", "high/__init__.py": "",
                            "high/a.py": "x = 1\n", "low/b.py": "def f():\n    from ci.high.a import x\n",
                            "cli.py": "TABLE = {'go': 'ci.high.a:main'}\n"})
    layers = read_layers("<!-- layers: x -->\n| layer | nodes |\n|---|---|\n"
                         "| 1 | `ci.low` |\n| 2 | `ci.high` |\n| 3 | `ci.cli` |\n<!-- /layers -->\n")
    packages = package_graph(import_graph(root))
    assert packages["ci.cli"] == {"ci.high"}  # the string table is an import
    assert upward_imports(packages, layers) == ["ci.low (layer 1) -> ci.high (layer 2)"]


def test_a_layer_table_that_names_a_node_twice_or_is_missing_is_refused():
    with pytest.raises(ValueError, match="layer 1 and layer 2"):
        read_layers("<!-- layers: -->\n| 1 | `ci.a` |\n| 2 | `ci.a` |\n<!-- /layers -->")
    with pytest.raises(ValueError, match="no layer table"):
        read_layers("# nothing here\n")


def test_the_check_finds_a_circle_between_packages(tmp_path):
    root = _tree(tmp_path, {"__init__.py": "", "top.py": "from ci.pkg.a import x\n",
                            "pkg/__init__.py": "", "pkg/a.py": "x = 1\n",
                            "pkg/b.py": "def f():\n    import ci.top\n"})
    modules = import_graph(root)
    assert find_cycle(modules) is None  # no two modules import each other
    assert find_cycle(package_graph(modules)) == ["ci.pkg", "ci.top", "ci.pkg"]


def test_the_check_finds_a_circle(tmp_path):
    root = _tree(tmp_path, {"__init__.py": "", "a.py": "from ci.b import x\n",
                            "b.py": "def f():\n    from . import c\n",
                            "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ci.a\n"})
    assert find_cycle(import_graph(root)) == ["ci.a", "ci.b", "ci.c", "ci.a"]


# --- the tests mirror the code: tests/toolkit/<package>/test_<module>[_aspect].py ------------

TESTS = REPO / "tests" / "toolkit"
# Modules without a test file named after them: the file that tests them, a string that file
# must contain (so the pointer cannot go stale unnoticed), and why they are tested there.
TESTED_ELSEWHERE: dict[str, tuple[str, str, str]] = {
    "ci/args.py": ("test_cli_properties.py", "python -m ci", "every command's parser, with generated arguments"),
    "ci/durations.py": ("test_bad_input.py", "durations", "through the run command that keeps the file"),
    "ci/errors.py": ("test_bad_input.py", "exit code", "every exit code, through the commands that raise"),
    "ci/log.py": ("run/test_runner.py", "GITHUB_STEP_SUMMARY", "the runner's Actions output, end to end"),
    "ci/proc.py": ("test_interrupts.py", "process group", "process groups under real signals"),
    "ci/registry/model.py": ("registry/test_loader.py", "Suite", "the schema as registries use it"),
    "ci/registry/repo_suites.py": ("registry/test_loader.py", "repo_suites", "data: audit and every suite run read it"),
    "ci/registry/cadences.py": ("github/test_job_plan_rules.py", "cadence", "schedules, through the job table"),
    "ci/registry/job_timeouts.py": ("github/test_job_plan_events.py", "timeout-minutes", "the jobs' limits"),
    "ci/registry/workflow_style.py": ("github/test_job_plan_rules.py", "Style", "the job table renders with it"),
    "ci/registry/u_files.py": ("u/test_u_selfcontained.py", "ci.registry.u_files", "U's copies and their sync"),
    "ci/select/import_graph.py": ("select/test_changed_affected.py", "import graph", "changed --affected"),
    "ci/select/executed.py": ("select/test_by_execution.py", "executed_functions", "records' scopes and lines"),
    "ci/select/unified_diff.py": ("select/test_by_execution.py", "parse_diff", "hunks to changed lines"),
    "ci/quality/audit_cases.py": ("quality/test_select_audit.py", "blamed commit", "through select-audit"),
    "ci/github/issue_kinds.py": ("github/test_flaky_issues.py", "kind=broken-main", "markers and owners, "
                                 "through the issues they make"),
    "ci/select/job_entries.py": ("run/test_record_executed.py", "--diff", "plan --diff on a recorded run"),
    "ci/gpu/safe_open.py": ("gpu/test_allocator_security.py", "symlink", "lock files others planted"),
    "ci/gpu/backfill.py": ("gpu/test_allocator_backfill.py", "schedule", "the decision, on real lock files"),
    "ci/backends/base.py": ("backends/test_backends.py", "ci.backends", "the backend interface, per backend"),
    "ci/backends/local.py": ("backends/test_backends.py", "local", "backend selection and preconditions"),
    "ci/backends/emulated.py": ("run/test_command_gpu.py", "--emulate-gpus", "emulated GPU suites end to end"),
    "ci/backends/process.py": ("run/test_runner.py", "subprocess", "every attempt the runner starts"),
    "ci/backends/launch.py": ("backends/test_backends.py", "ci.backends.launch", "an entry's argv and variables"),
    "ci/backends/ray_task.py": ("backends/test_ray_cluster.py", "ray", "the node side of a real cluster run"),
    "ci/history/rows.py": ("history/test_store.py", "ci.history.rows", "what the store writes and reads back"),
    "ci/history/schema.py": ("history/test_store.py", "schema", "migrations on SQLite and PostgreSQL"),
    "ci/history/stats.py": ("history/test_record.py", "ci.history.stats", "p90 and failure-first order"),
    "ci/history/bisects.py": ("github/test_bisect_workflow_answer.py", "ci.history.bisects",
                              "an answer exported, ingested, read back and named in an issue"),
    "ci/github/rest_client.py": ("github/test_pr_verdicts.py", "fake_github", "GitHub's API through a stand-in"),
    "ci/run/report.py": ("run/test_runner.py", "junit", "the table and JUnit of real runs"),
    "ci/run/options.py": ("run/test_pipeline.py", "parse(", "the parsed options every stage takes"),
    "ci/history/run_observer.py": ("run/test_pipeline.py", "attempt_ended", "the observer interface, by a "
                                   "recording observer through the pipeline"),
    "ci/github/yaml_writer.py": ("github/test_workflow.py", "yaml", "the generated workflows, parsed back"),
    "ci/github/comment_reply.py": ("github/test_comment_commands.py", "issue_comment", "plan --event issue_comment"),
    "ci/github/teams.py": ("github/test_comment_commands.py", "ci.github.teams", "team access policies"),
    "ci/adopt/sessions.py": ("adopt/test_switch.py", "ci.adopt.sessions", "an adopter's sessions, from a wheel"),
    "ci/hud/read.py": ("hud/test_hud_cli.py", "--history", "the store's reads, through the command"),
    "ci/hud/site.py": ("hud/test_hud_cli.py", "index.html", "the site a build writes"),
    "ci/hud/svg.py": ("hud/test_entry_page.py", "<svg", "the charts of an entry's page"),
    "ci/hud/style.py": ("hud/test_pages_browser.py", "hud.css", "the style sheet, as Chromium renders it"),
    "ci/quality/mutation_targets.py": ("quality/test_mutation.py", "MUTATION_TARGETS", "the targets exist"),
    "ci/actions/act_argv.py": ("actions/test_triggers.py", "act_argv", "act's argv and environment, pure"),
    "ci/actions/stand_ins.py": ("actions/test_triggers.py", "check_mapped", "every pinned action mapped"),
    "ci/actions/stand_in.py": ("actions/test_harness_events.py", "cache-restore", "each stand-in, under act"),
    "ci/actions/events.py": ("actions/test_harness_pull_requests.py", "EventSpec", "payloads, under act"),
    "ci/actions/job_runs.py": ("actions/test_actions_cli.py", "JobRun", "the rows the table shows"),
    "ci/actions/parity.py": ("actions/test_harness_pull_requests.py", "disagreements", "act against plan"),
    "ci/actions/outcome_table.py": ("actions/test_actions_cli.py", "render(", "the table and --json"),
    "ci/actions/github_api.py": ("github/test_pr_verdicts.py", "fake_github", "the REST stand-in, served"),
    "ci/suites.py": ("registry/test_loader.py", "ci.suites", "a re-export: the previous release's registry"),
    "ci/nox_sessions.py": ("registry/test_loader.py", "ci.nox_sessions", "a re-export: the previous noxfile"),
    "ci/run/coverage_flush.py": ("run/test_record_executed_actors.py", "ray.kill",
                                 "loaded by coverage in every process of a recorded entry"),
}
# Test files named after no module: what they test instead.
CROSS_CUTTING: dict[str, str] = {
    "test_architecture.py": "the layout: layers, circles, this map",
    "test_bad_input.py": "bad input to every command",
    "test_cli_properties.py": "every command's parser (ci/cli.py and each command)",
    "test_noxfile.py": "noxfile.py: one session per suite",
    "test_packaging.py": "the wheel: the toolkit alone",
    "test_tasks.py": "tasks.py: the invoke tasks",
    "test_docs.py": "README.md and docs/: links, length",
    "test_netns_hosts.py": "the namespace-host fixture (_netns_hosts.py): names, clean-up",
    "runners/test_rootless_slots.py": "runners/setup_slots.py: two rootless slots and what a job reaches",
    "u/test_u_selfcontained.py": "U as a whole: stdlib only, its generated copies in sync",
}
U_DIR = REPO / "slime" / "utils" / "external_utils"


def _modules() -> list[Path]:
    return sorted(p for p in (REPO / "ci").rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def _test_dir(module: Path) -> Path:
    rel = module.relative_to(REPO / "ci").parent
    return TESTS / rel


def test_every_module_has_its_test_file_or_says_where_it_is_tested():
    missing, stale = [], []
    for module in _modules():
        rel = str(module.relative_to(REPO))
        named = list(_test_dir(module).glob(f"test_{module.stem}.py")) + list(
            _test_dir(module).glob(f"test_{module.stem}_*.py"))
        if named:
            if rel in TESTED_ELSEWHERE:
                stale.append(f"{rel} has {named[0].relative_to(REPO)}: drop it from TESTED_ELSEWHERE")
            continue
        if rel not in TESTED_ELSEWHERE:
            missing.append(rel)
            continue
        where, evidence, _why = TESTED_ELSEWHERE[rel]
        text = (TESTS / where).read_text(encoding="utf-8") if (TESTS / where).is_file() else ""
        if evidence not in text:
            stale.append(f"{rel}: tests/toolkit/{where} does not exist or never says {evidence!r}")
    assert not missing, f"modules with no tests/toolkit/<package>/test_<module>.py: {missing}"
    assert not stale, stale
    assert not set(TESTED_ELSEWHERE) - {str(m.relative_to(REPO)) for m in _modules()}


def test_no_test_file_is_named_after_a_module_that_does_not_exist():
    strays = []
    for test in sorted(TESTS.rglob("test_*.py")):
        rel = str(test.relative_to(TESTS))
        if rel in CROSS_CUTTING or "data" in test.relative_to(TESTS).parts:
            continue
        folder = test.parent
        code = U_DIR if folder.name == "u" else REPO / "ci" / folder.relative_to(TESTS)
        stems = {p.stem for p in code.glob("*.py") if p.stem != "__init__"}
        if folder != TESTS and (code / "__init__.py").is_file():
            stems.add(code.name)  # the package itself (tests/toolkit/backends/test_backends.py)
        name = test.stem.removeprefix("test_")
        if not any(name == s or name.startswith(s + "_") for s in stems):
            strays.append(rel)
    assert not strays, f"test files named after no module (rename them, or list them in CROSS_CUTTING): {strays}"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
