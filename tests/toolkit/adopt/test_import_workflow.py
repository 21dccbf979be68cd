"""`python -m ci import-workflow`: slime's matrix template in, a working `.slime-ci/suites.py` out.

Templates here are written for the tests in the format of slime's `pr-test.yml.j2`
(`<% %>` / `<< >>` delimiters, `megatron_tests` and `jobs` set at the top, a YAML body
with GitHub's `${{ }}`), over a tiny `tests/` tree in tmp_path; the generated registry is
then loaded, audited and run by the toolkit as any checkout's own.
"""

import json
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, run_ci, write

from ci.adopt.import_workflow import GENERATED_MARK, read_matrix, suite_name, uses_processes
from ci.backends.launch import entry_env
from ci.errors import UsageError
from ci.registry.loader import load_registry
from ci.run.runner import CoreSlots, RunConfig

NUM_GPUS = 0

BODY = """
name: PR Test
on:
  pull_request:
    branches: [main]
jobs:
<% for job_name, config in jobs.items() %>
  << job_name >>:
    if: ${{ contains(github.event.pull_request.labels.*.name, '<< config.label >>') }}
    <% set runner = 'ubuntu-latest' if config.cpu else 'self-hosted' %>
    runs-on: << runner >>
    strategy:
      matrix:
        info: << config.tests | tojson(indent=2) | indent(10, true) >>
<% endfor %>
"""

CLEAN = """
<% set megatron_tests = [
    {'test_file': 'test_tiny_e2e.py', 'num_gpus': 2},
    {'test_file': 'test_tiny_e2e.py', 'num_gpus': 2, 'use_deepep': '1', 'use_fp8_rollout': '1',
     'enable_eval': '0'},
    {'test_file': 'test_ckpt_e2e.py', 'test_args': '--save-optimizer gpu  --async-save', 'num_gpus': 4},
] %>
{# a comment between the two sets #}
<% set jobs = {
    'e2e-test-sglang-config': {
      'label': 'run-ci-sglang-config',
      'tests': [
        {'test_file': 'utils/test_config_check.py', 'num_gpus': 0},
      ],
    },
    'e2e-test-megatron': {'label': 'run-ci-megatron', 'tests': megatron_tests},
    'cpu-unittest': {
      'label': 'run-ci-cpu-unittest',
      'always': True,
      'cpu': True,
      'extra_pip_deps': 'transformers wandb',
      'tests': [
        {'test_file': 'test_math.py', 'num_gpus': 0},
        {'test_file': 'plugin_contracts/test_contract.py', 'num_gpus': 0},
      ],
    },
    'agent-test': {
      'label': 'run-ci-agent', 'always': True, 'cpu': True,
      'tests': [{'test_file': 'test_agent/test_adapter.py', 'num_gpus': 0}],
    },
    'e2e-test-image': {'label': 'run-ci-image', 'image': 'slimerl/slime-test:latest',
                       'tests': megatron_tests},
} %>
""" + BODY

E2E = """
    import sys
    NUM_GPUS = {n}

    def execute():
        print("would train", sys.argv[1:])

    if __name__ == "__main__":
        execute()
"""

CONFIG_CHECK = """
    NUM_GPUS = 0

    def check():
        print("config ok")

    if __name__ == "__main__":
        check()
"""


def _tree(root, extra=None):
    files = {
        "tests/test_math.py": PASSING,
        "tests/plugin_contracts/test_contract.py": PASSING,
        "tests/test_agent/test_adapter.py": PASSING,
        "tests/test_tiny_e2e.py": E2E.replace("{n}", "2"),
        "tests/test_ckpt_e2e.py": E2E.replace("{n}", "4"),
        "tests/utils/test_config_check.py": CONFIG_CHECK,
        "tests/_helpers.py": "X = 1\n",  # not a test file: never reported
        **(extra or {}),
    }
    return write(root, files)


def _template(root, text):
    path = root / ".github" / "workflows" / "pr-test.yml.j2"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_a_clean_matrix_imports_loads_audits_and_runs(tmp_path):
    root = _tree(tmp_path / "repo")
    template = _template(root, CLEAN)
    done = run_ci("import-workflow", str(template))  # the root is found from the template's path
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines() == [
        f"import: wrote {root / '.slime-ci' / 'suites.py'} (5 suites, 10 entries, 0 finding(s))"]
    text = (root / ".slime-ci" / "suites.py").read_text()
    assert GENERATED_MARK in text and "MEGATRON_TESTS" in text
    compile(text, "suites.py", "exec")
    suites = {s.name: s for s in load_registry(root)}
    assert list(suites) == ["sglang_config", "megatron", "cpu_unit", "agent_adapter", "image"]
    cpu, agent, mega, image, sglang = (suites[n] for n in
                                       ("cpu_unit", "agent_adapter", "megatron", "image", "sglang_config"))
    assert (cpu.tier, cpu.label, cpu.profile, cpu.include, cpu.timeout) == ("cpu", None, "cpu", (), 1200)
    assert [e.path for e in cpu.entries] == ["tests/test_math.py", "tests/plugin_contracts/test_contract.py"]
    assert "transformers wandb" in cpu.purpose
    assert (agent.profile, agent.label) == ("agent", None)
    assert (mega.tier, mega.label, mega.image, mega.timeout) == ("gpu", "run-ci-megatron",
                                                                 "slimerl/slime:latest", 3600)
    assert mega.entries == image.entries and image.image == "slimerl/slime-test:latest"
    plain, flagged, ckpt = mega.entries
    assert plain.env == () and plain.test_args == ()
    assert dict(flagged.env) == {"SLIME_TEST_USE_DEEPEP": "1", "SLIME_TEST_USE_FP8_ROLLOUT": "1",
                                 "SLIME_TEST_ENABLE_EVAL": "0"}
    assert ckpt.test_args == ("--save-optimizer", "gpu", "--async-save")
    assert flagged.id != plain.id or flagged.env != plain.env
    (check,) = sglang.entries
    assert check.cpu_only and check.path == "tests/utils/test_config_check.py"

    audit = run_ci("audit", "--root", str(root))
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "audit: 6 test files, no problems" in audit.stdout
    ran = run_ci("run", "--suite", "cpu_unit", "--root", str(root), timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 entries" in ran.stdout and "PASS" in ran.stdout
    dry = run_ci("run", "--suite", "megatron", "--root", str(root), "--dry-run", "--no-docker")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "tests/test_ckpt_e2e.py --save-optimizer gpu --async-save  gpus=4" in dry.stdout

    again = run_ci("import-workflow", str(template), "--root", str(root))  # its own output: replaced
    assert again.returncode == 0, again.stderr
    assert (root / ".slime-ci" / "suites.py").read_text() == text


DEFECTS = """
<% set jobs = {
    'cpu-unittest': {'label': 'x', 'always': True, 'cpu': True, 'timeout_minutes': 30, 'tests': [
        {'test_file': 'test_math.py', 'num_gpus': 0},
        {'test_file': 'test_gone.py', 'num_gpus': 0},
        {'test_file': 'test_no_decl.py', 'num_gpus': 0},
        {'test_file': 'test_dist.py', 'num_gpus': 0, 'use_magic': '1'},
        {'test_file': 'check_misnamed.py', 'num_gpus': 0},
    ]},
    'e2e-test-ckpt': {'label': 'run-ci-ckpt', 'tests': [
        {'test_file': 'test_tiny_e2e.py', 'num_gpus': 8},
        {'test_file': 'test_gone.py', 'num_gpus': 8},
    ]},
} %>
""" + BODY

GLOO = """
    import sys
    import pytest
    import torch.distributed as dist
    NUM_GPUS = 0

    def test_group():
        assert dist.is_available() and "gloo"

    if __name__ == "__main__":
        raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
"""


def test_defects_are_one_line_each_and_missing_files_are_left_out(tmp_path):
    root = _tree(tmp_path / "repo", {
        "tests/test_no_decl.py": PASSING.replace("NUM_GPUS = 0", ""),
        "tests/test_dist.py": GLOO,
        "tests/check_misnamed.py": PASSING,
    })
    template = _template(root, DEFECTS)
    done = run_ci("import-workflow", str(template), "--root", str(root), "--dry-run")
    assert done.returncode == 0, done.stderr
    findings = [line for line in done.stdout.splitlines() if line.startswith("import: ")]
    assert findings == [
        "import: job 'cpu-unittest': key 'timeout_minutes' is not known; ignored",
        "import: job 'cpu-unittest', test #4 (test_dist.py): key 'use_magic' is not known; ignored",
        "import: tests/test_gone.py: listed by job cpu-unittest but the file does not exist; "
        "left out of the suites",
        "import: tests/test_no_decl.py:1: declares no NUM_GPUS (the matrix says 0 in job "
        "cpu-unittest); add `NUM_GPUS = 0`",
        "import: tests/check_misnamed.py: listed by job cpu-unittest but its name is not "
        "tests/**/test_*.py, so no command would find it; left out of the suites",
        "import: tests/test_tiny_e2e.py:2: NUM_GPUS = 2 but job e2e-test-ckpt lists it with num_gpus 8",
        "import: tests/plugin_contracts/test_contract.py: no job lists it",
        "import: tests/test_agent/test_adapter.py: no job lists it",
        "import: tests/test_ckpt_e2e.py: no job lists it",
        "import: tests/utils/test_config_check.py: no job lists it",
        "import: 2 suites, 4 entries, 10 finding(s); nothing written (--dry-run)",
    ]
    assert not (root / ".slime-ci").exists()  # a dry run writes nothing
    assert "Entry(path='tests/test_dist.py', cores=2)" in done.stdout
    assert "test_gone" not in done.stdout.split('"""', 2)[2]


@pytest.mark.parametrize(("text", "message"), [
    ("<% set jobs = {'a': {'tests': []} %>\n", "j2:1: not a valid Jinja2 template"),
    ("<% set other = [1] %>\nname: x\n", "no `<% set jobs = {...} %>` at the top level"),
    ("<% set jobs = {'a': {'tests': tests | list}} %>\n", "1: Filter expression in the matrix"),
    ("<% set jobs = {'a': {'tests': undefined_tests}} %>\n", "`undefined_tests` is not set above it"),
    ("<% set jobs = {'a': {'tests': [{'test_file': 't.py', 'num_gpus': '8'}]}} %>\n",
     "num_gpus must be an integer >= 0, got '8'"),
    ("<% set jobs = {'a': {'tests': [{'num_gpus': 1}]}} %>\n", "test_file must be a .py path"),
    ("<% set jobs = {'a': {'tests': [{'test_file': 't.py', 'num_gpus': 1, 'test_args': ['-x']}]}} %>\n",
     "test_args must be one string"),
    ("<% set jobs = {'a': {'label': 'x'}} %>\n", "job 'a': `tests` must be a list"),
    ("<% set jobs = [] %>\n", "`jobs` must be a non-empty mapping"),
    ("<% set jobs = {'a-b': {'tests': []}, 'a_b': {'tests': []}} %>\n", "both map to suite 'a_b'"),
])
def test_an_ill_formed_template_is_one_line_and_exit_2(tmp_path, text, message):
    root = _tree(tmp_path / "repo")
    template = _template(root, text)
    done = run_ci("import-workflow", str(template))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert message in done.stderr, done.stderr
    assert not (root / ".slime-ci").exists()


def test_unreadable_template_and_foreign_registry_are_refused(tmp_path):
    root = _tree(tmp_path / "repo")
    missing = run_ci("import-workflow", str(root / "nope.yml.j2"), "--root", str(root))
    assert missing.returncode == 2 and "cannot read the template" in missing.stderr
    binary = root / "bin.j2"
    binary.write_bytes(b"\xff\xfe\x00bad")
    assert run_ci("import-workflow", str(binary), "--root", str(root)).returncode == 2
    no_tests = run_ci("import-workflow", str(binary), "--root", str(tmp_path))
    assert no_tests.returncode == 2 and "no tests/ directory" in no_tests.stderr
    template = _template(root, CLEAN)
    own = root / ".slime-ci" / "suites.py"
    own.parent.mkdir()
    own.write_text("SUITES = ()\n")
    refused = run_ci("import-workflow", str(template))
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert own.read_text() == "SUITES = ()\n"
    assert run_ci("import-workflow", str(template), "--force").returncode == 0
    assert GENERATED_MARK in own.read_text()


def test_the_parser_reads_jinja_not_text():
    # A `set` inside the loop body, `${{ }}`, comments and line breaks anywhere: Jinja's own
    # parser sees only the two top-level assignments.
    matrix = read_matrix(textwrap.dedent("""
        {# <% set jobs = {'fake': {}} %> inside a comment is not an assignment #}
        <% set shared = [{'test_file': 'a/test_x.py',
                          'num_gpus': 1, 'test_args': '-k  fast'}] %>
        <% set jobs = {'e2e-test-x': {'label': 'run-ci-x', 'tests': shared, 'cpu': False}} %>
        <% for name, c in jobs.items() %><% set jobs = 3 %>${{ github.sha }}<< c.label >><% endfor %>
    """))
    (job,) = matrix.jobs
    assert (job.name, job.label, job.cpu, job.shared) == ("e2e-test-x", "run-ci-x", False, "shared")
    (entry,) = job.entries
    assert (entry.test_file, entry.num_gpus, entry.test_args) == ("a/test_x.py", 1, ("-k", "fast"))
    assert suite_name("e2e-test-x") == "x" and suite_name("cpu-unittest") == "cpu_unit"
    with pytest.raises(UsageError, match="session name"):
        suite_name("e2e-test-1st")


def test_process_spawning_files_are_found_by_ast():
    assert uses_processes("import torch.multiprocessing as mp\nmp.spawn(f, nprocs=4)\n")
    assert uses_processes("from multiprocessing import Process\nProcess(target=f).start()\n")
    assert uses_processes("dist.init_process_group('gloo', rank=0, world_size=2)\n")
    assert not uses_processes("# mp.spawn in a comment\nx = 'gloo is mentioned in a sentence'\n")
    assert not uses_processes("def (:\n")


def test_core_slots_never_overbook_and_serve_in_order():
    slots = CoreSlots(2)
    stop = threading.Event()
    events, lock = [], threading.Lock()
    busy = [0]

    def job(name, cores, hold):
        with slots.hold(cores, stop):
            with lock:
                busy[0] += min(cores, 2)
                events.append((name, busy[0]))
            time.sleep(hold)
            with lock:
                busy[0] -= min(cores, 2)

    light = threading.Thread(target=job, args=("light1", 1, 0.4))
    light.start()
    time.sleep(0.1)
    heavy = threading.Thread(target=job, args=("heavy", 5, 0.3))  # clamped to the 2 slots
    heavy.start()
    time.sleep(0.1)
    late = threading.Thread(target=job, args=("light2", 1, 0.1))  # a slot is free, but heavy is first
    late.start()
    for t in (light, heavy, late):
        t.join(10)
    assert [name for name, _ in events] == ["light1", "heavy", "light2"]
    assert max(b for _, b in events) <= 2 and dict(events)["heavy"] == 2
    stop.set()  # a waiter gives up when the run stops
    with slots.hold(1, stop), slots.hold(2, stop):
        pass


TIMED = """
    import os, sys, time
    import pytest
    NUM_GPUS = 0
    BACKEND = "gloo"  # makes the import mark it as running processes of its own

    def test_sleep():
        start = time.time()
        time.sleep(1.5)
        with open(os.path.join(os.environ["SPANS"], os.path.basename(__file__)), "w") as f:
            f.write(f"{start} {time.time()}")

    if __name__ == "__main__":
        raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
"""


def test_the_runner_keeps_multi_process_files_apart(tmp_path):
    root = write(tmp_path / "repo", {
        "tests/test_heavy_a.py": TIMED, "tests/test_heavy_b.py": TIMED,
        "tests/test_light_a.py": TIMED.replace("gloo", "none"),
        "tests/test_light_b.py": TIMED.replace("gloo", "none"),
    })
    template = _template(root, """
        <% set jobs = {'cpu-unittest': {'label': 'x', 'always': True, 'cpu': True, 'tests': [
            {'test_file': 'test_heavy_a.py', 'num_gpus': 0}, {'test_file': 'test_heavy_b.py', 'num_gpus': 0},
            {'test_file': 'test_light_a.py', 'num_gpus': 0}, {'test_file': 'test_light_b.py', 'num_gpus': 0},
        ]}} %>
    """)
    assert run_ci("import-workflow", str(template)).returncode == 0
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    ran = run_ci("run", "--suite", "cpu_unit", "--root", str(root), "-j", "2",
                 env={"SPANS": str(spans_dir)}, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    spans = {p.name: tuple(map(float, p.read_text().split())) for p in spans_dir.iterdir()}
    assert len(spans) == 4, spans

    def overlap(a, b):
        return min(spans[a][1], spans[b][1]) - max(spans[a][0], spans[b][0])

    assert overlap("test_heavy_a.py", "test_heavy_b.py") < 0
    for heavy in ("test_heavy_a.py", "test_heavy_b.py"):
        for light in ("test_light_a.py", "test_light_b.py"):
            assert overlap(heavy, light) < 0, json.dumps(spans)
    assert overlap("test_light_a.py", "test_light_b.py") > 0.5  # the light ones do share the run


ENV_REPORT = """
    import os, sys
    import pytest
    NUM_GPUS = 0

    def test_report_env():
        with open(os.path.join(os.environ["SPANS"], os.path.basename(__file__)), "w") as fh:
            fh.write(os.environ["TORCHINDUCTOR_CACHE_DIR"] + "\\n" + os.environ["TMPDIR"])

    if __name__ == "__main__":
        raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
"""


def test_compile_cache_outlives_the_private_temp_dirs(tmp_path, monkeypatch):
    # An outer run (the toolkit suite itself) sets the variable for its entries; this test
    # checks the default the runner picks, so the variable must not come from outside.
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    # slime's loss functions use torch.compile, whose cache lives under TMPDIR by default;
    # entries get private TMPDIRs, so the cache is pointed where torch would put it.
    from ci.select.entries import ResolvedEntry

    entry = ResolvedEntry(id="tests/test_x.py", path="tests/test_x.py", timeout=10, num_gpus=0, kind="pytest")
    cfg = RunConfig(root=tmp_path, work_dir=tmp_path / "w", jobs=1, base_env={"TMPDIR": "/var/tmpx"})
    env = entry_env(entry, cfg, devices=(), out_dir=tmp_path / "o", tmp_dir=tmp_path / "t").local()
    assert env["TMPDIR"] == str(tmp_path / "t")
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith("/var/tmpx/torchinductor_")
    mine = RunConfig(root=tmp_path, work_dir=tmp_path / "w", jobs=1,
                     base_env={"TORCHINDUCTOR_CACHE_DIR": "/cache"})
    assert entry_env(entry, mine, devices=(), out_dir=tmp_path / "o",
                     tmp_dir=tmp_path / "t").local()["TORCHINDUCTOR_CACHE_DIR"] == "/cache"

    # Two real entries see one cache dir, outside their two private temp dirs. (That torch
    # then keeps its kernels there is torch's documented use of the variable; compiling
    # here would take minutes on a loaded 2-core machine.)
    root = write(tmp_path / "repo", {"tests/test_compiled_a.py": ENV_REPORT,
                                     "tests/test_compiled_b.py": ENV_REPORT})
    template = _template(root, """
        <% set jobs = {'cpu-unittest': {'label': 'x', 'always': True, 'cpu': True, 'tests': [
            {'test_file': 'test_compiled_a.py', 'num_gpus': 0}, {'test_file': 'test_compiled_b.py', 'num_gpus': 0},
        ]}} %>
    """)
    assert run_ci("import-workflow", str(template)).returncode == 0
    spans = tmp_path / "spans"
    spans.mkdir()
    outer = tmp_path / "outer-tmp"
    outer.mkdir()
    ran = run_ci("run", "--suite", "cpu_unit", "--root", str(root), "-j", "1",
                 env={"SPANS": str(spans), "TMPDIR": str(outer)}, timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    seen = [p.read_text().splitlines() for p in sorted(spans.iterdir())]
    (cache_a, tmp_a), (cache_b, tmp_b) = seen
    assert cache_a == cache_b and tmp_a != tmp_b  # one cache, two private temp dirs
    assert cache_a.startswith(str(outer) + "/torchinductor_")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
