"""What a job under act calls where this machine has no GitHub: one script, run by path.

Standard library only, and never imported from the job's checkout: the job may have checked out
a commit whose `ci/` is older (the verdict job checks out the PR's base). `python -m ci actions`
copies this file into its state folder and points every stand-in at the copy:

    stand_in.py nox ARGS            the recording `nox`: logs the argv, exits 0 (or the status
                                    asked for); the sessions named in $SLIME_CI_ACTIONS_REAL run
                                    their registered commands for real (history, verdict, monitor)
    stand_in.py gh ARGS             the GitHub CLI's `api` and `workflow run`, against $GITHUB_API_URL
    stand_in.py python ARGS         the host's Python, logged; `-m pip install nox==…` is a no-op
    stand_in.py session-python S ARGS
                                    the Python of session S that the recording `nox -s S
                                    --install-only` leaves in .nox/S/bin: logs, runs nothing
    stand_in.py checkout|setup-python|cache-restore|cache-save|upload-artifact
                                    the pinned actions' composite stand-ins (inputs as INPUT_* env)

Every call appends one JSON line to $SLIME_CI_ACTIONS_STATE/records.jsonl: which job, which
tool, its argv and the environment the job gave it (the harness asserts on both).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

STATE_ENV = "SLIME_CI_ACTIONS_STATE"
SOURCE_ENV = "SLIME_CI_ACTIONS_SOURCE"  # the clone the checkout stand-in fetches from
REAL_ENV = "SLIME_CI_ACTIONS_REAL"  # JSON {session: [[argv], ...]}: sessions run for real
FAIL_ENV = "SLIME_CI_ACTIONS_FAIL"  # JSON {session: exit status} for the recording nox
NOX_REAL_ENV = "SLIME_CI_ACTIONS_NOX"  # --real: the real nox executable
PYTHON_ENV = "SLIME_CI_ACTIONS_PYTHON"  # the host's interpreter
EMULATE_ENV = "SLIME_CI_ACTIONS_EMULATE"  # --real: JSON list of GPU sessions to run --emulate-gpus
REAL_JOBS_ENV = "SLIME_CI_ACTIONS_REAL_JOBS"  # --real-jobs: JSON list of the job ids run for real
PLAN_JOBS_ENV = "SLIME_CI_ACTIONS_PLAN_JOBS"  # a test's JSON list: the plan job's `jobs` output
REAL_ONLY_ENV = "SLIME_CI_ACTIONS_REAL_ONLY"  # --real-only: the `--only` selector of a real GPU suite


def _state() -> Path:
    return Path(os.environ[STATE_ENV])


def _record(tool: str, argv: list[str], **extra: object) -> None:
    row = {"tool": tool, "job": os.environ.get("GITHUB_JOB", ""),
           "workflow": os.environ.get("GITHUB_WORKFLOW", ""), "argv": argv, "cwd": os.getcwd(),
           "env": dict(os.environ), "time": time.time(), **extra}
    with (_state() / "records.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")


def _input(name: str, default: str = "") -> str:
    return os.environ.get("INPUT_" + name.upper().replace(" ", "_"), default).strip()


def _output(**values: str) -> None:
    with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as out:
        for key, value in values.items():
            out.write(f"{key}={value}\n")


def _lines(text: str) -> list[str]:
    return [x.strip() for x in text.replace("\\n", "\n").splitlines() if x.strip()]


def nox(argv: list[str]) -> int:
    session = argv[argv.index("-s") + 1] if "-s" in argv else ""
    posargs = argv[argv.index("--") + 1:] if "--" in argv else []
    real = json.loads(os.environ.get(REAL_ENV) or "{}")
    jobs = json.loads(os.environ.get(REAL_JOBS_ENV) or "[]")
    if os.environ.get(NOX_REAL_ENV) and (not jobs or os.environ.get("GITHUB_JOB") in jobs):
        # --real: the real session (--real-jobs: in the jobs named only); a GPU suite on this
        # host's emulated GPUs, as `nox -s gpu_smoke` runs them, since a GPU job here has no GPU.
        # The record keeps the step's argv (what the plan says it runs); `added` is ours.
        added: list[str] = []
        if session in json.loads(os.environ.get(EMULATE_ENV) or "[]"):
            only = os.environ.get(REAL_ONLY_ENV, "")
            added = ["--emulate-gpus", *(["--only", only] if only else [])]
        _record("nox", argv, real=True, depth="real", added=added)
        run = argv if not added else [*argv, *added] if "--" in argv else [*argv, "--", *added]
        print(f"stand-in nox under --real: nox {' '.join(run)}")
        return subprocess.call([os.environ[NOX_REAL_ENV], *run])
    if session in real:
        _record("nox", argv, real=True)
        commands = real[session]
        for i, command in enumerate(commands):
            extra = posargs if i == len(commands) - 1 else []
            program = os.environ[PYTHON_ENV] if command[0] == "python" else command[0]
            argv_run = [program, *command[1:], *extra]
            code = subprocess.call(argv_run)
            if code:
                return code
        return 0
    _record("nox", argv, real=False)
    print(f"stand-in nox (records, runs nothing): nox {' '.join(argv)}")
    if "--install-only" in argv and session:
        _session_venv(session)
    # What a suite's session leaves for the job's later steps: the durations file that the
    # cache save step keys on (marked as the stand-in's, so a restore shows whose it is).
    cache = Path(".ci-cache")
    cache.mkdir(exist_ok=True)
    durations = cache / "durations.json"
    if not durations.exists():
        durations.write_text(json.dumps({"stand-in": f"nox -s {session}",
                                         "run_id": os.environ.get("GITHUB_RUN_ID", "")}) + "\n")
    return int(json.loads(os.environ.get(FAIL_ENV) or "{}").get(session, 0))


def _session_venv(session: str) -> None:
    """What `--install-only` leaves: the session's interpreter, `.nox/<session>/bin/python`, here
    a recording stand-in too (a later step runs `"$venv/bin/python" -m ci ...`, bisect.yml's)."""
    python = Path(".nox") / session / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" '
                      f'session-python {session} "$@"\n', encoding="utf-8")
    python.chmod(0o755)


def session_python(argv: list[str]) -> int:
    """The recording session's Python: logs the call as `python ARGS`, runs nothing."""
    session, rest = argv[0], argv[1:]
    _record("python", rest, session=session, real=False)
    print(f"stand-in python of the recording nox's {session} session (runs nothing): python {' '.join(rest)}")
    return 0


def _api(method: str, path: str, body: object | None) -> bytes:
    base = os.environ["GITHUB_API_URL"].rstrip("/")
    url = path if path.startswith("http") else f"{base}/{path.lstrip('/')}"
    data = json.dumps(body).encode() if body is not None else None
    token = os.environ.get("GH_TOKEN") or os.environ.get("GITHUB_TOKEN") or ""
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return bytes(answer.read())
    except urllib.error.HTTPError as exc:
        print(f"gh: HTTP {exc.code} for {method} {path}", file=sys.stderr)
        raise SystemExit(1) from None


def gh(argv: list[str]) -> int:
    _record("gh", argv)
    if argv[:2] == ["workflow", "run"]:
        fields: dict[str, str] = {}
        repo, ref, i = os.environ.get("GITHUB_REPOSITORY", ""), "", 3
        rest = argv[3:]
        i = 0
        while i < len(rest):
            if rest[i] in ("--repo", "-R"):
                repo = rest[i + 1]
            elif rest[i] == "--ref":
                ref = rest[i + 1]
            elif rest[i] in ("-f", "--field", "-F"):
                key, _, value = rest[i + 1].partition("=")
                fields[key] = value
            i += 2
        _api("POST", f"repos/{repo}/actions/workflows/{argv[2]}/dispatches", {"ref": ref, "inputs": fields})
        return 0
    if not argv or argv[0] != "api":
        print(f"stand-in gh: only `gh api` and `gh workflow run` are answered here, not gh {argv[:2]}",
              file=sys.stderr)
        return 1
    method, jq, path = "", "", ""
    body: dict[str, object] = {}
    rest, i = argv[1:], 0
    while i < len(rest):
        a = rest[i]
        if a == "--paginate":
            i += 1
            continue
        if a in ("-X", "--method"):
            method = rest[i + 1]
        elif a == "--jq":
            jq = rest[i + 1]
        elif a in ("-f", "-F", "--field", "--raw-field"):
            key, _, value = rest[i + 1].partition("=")
            if key.endswith("[]"):
                listed = body.setdefault(key[:-2], [])
                assert isinstance(listed, list)
                listed.append(value)
            else:
                body[key] = value
        else:
            path = a
            i += 1
            continue
        i += 2
    raw = _api(method or ("POST" if body else "GET"), path, body or None)
    if jq:
        subprocess.run(["jq", "-r", jq], input=raw, check=True)
    else:
        sys.stdout.buffer.write(raw)
    return 0


def python(argv: list[str]) -> int:  # replaces this process, or returns 0
    if argv[:3] == ["-m", "pip", "install"] and all(a.startswith("nox") for a in argv[3:]):
        _record("python", argv, skipped=True)
        print("stand-in: nox is already here (the recording nox, or the host's under --real)")
        return 0
    planned = os.environ.get(PLAN_JOBS_ENV)
    if planned and argv[:3] == ["-m", "ci", "plan"]:
        # A test's probe of the `if:` rules alone: the real plan runs, then its `jobs` output is
        # replaced (act reads the last value a key is given), so every job it lists reaches its
        # own `if:` and only the rules the generator rendered decide.
        _record("python", argv, plan_jobs=json.loads(planned))
        code = subprocess.call([os.environ[PYTHON_ENV], *argv])
        _output(jobs=planned)
        print(f"stand-in: the plan's jobs output replaced by the test's {planned}")
        return code
    _record("python", argv)
    os.execv(os.environ[PYTHON_ENV], [os.environ[PYTHON_ENV], *argv])


def checkout() -> int:
    ref = _input("ref") or os.environ["GITHUB_SHA"]
    depth = int(_input("fetch-depth", "1") or 1)
    _record("checkout", [ref], depth=depth)
    source = "file://" + os.environ[SOURCE_ENV]
    workspace = os.environ["GITHUB_WORKSPACE"]
    git = ["git", "-C", workspace, "-c", "advice.detachedHead=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    # Borrow the clone's objects (read-only), so the fetch moves none; the depth still holds,
    # since a shallow fetch records its boundary and git stops there as on GitHub.
    objects = Path(workspace, ".git", "objects", "info")
    objects.mkdir(parents=True, exist_ok=True)
    (objects / "alternates").write_text(os.path.join(os.environ[SOURCE_ENV], ".git", "objects") + "\n")
    subprocess.run([*git, "fetch", "-q", "--no-tags", *([f"--depth={depth}"] if depth > 0 else []),
                    source, ref], check=True)
    subprocess.run([*git, "checkout", "-q", "--detach", "FETCH_HEAD"], check=True)
    print(f"stand-in checkout: {ref} (depth {depth or 'all'}) from {source}")
    return 0


def setup_python() -> int:
    _record("setup-python", [_input("python-version")])
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    print(f"stand-in setup-python: the host's Python {host} for {_input('python-version')}")
    return 0


def _cache_dir(key: str) -> Path:
    return _state() / "cache" / key


def cache_restore() -> int:
    key, paths = _input("key"), _lines(_input("path"))
    restore_keys = _lines(_input("restore-keys"))
    root = _state() / "cache"
    saved = sorted(root.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True) if root.is_dir() else []
    hit = _cache_dir(key) if _cache_dir(key).is_dir() else None
    matched = key if hit else ""
    for prefix in restore_keys if hit is None else []:
        found = next((p for p in saved if p.name.startswith(prefix)), None)
        if found is not None:
            hit, matched = found, found.name
            break
    _record("cache-restore", [key, *restore_keys], matched=matched, exact=matched == key)
    if hit is not None:
        for path in paths:
            if (hit / path).is_file():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(hit / path, path)
    _output(**{"cache-hit": "true" if matched == key else "false", "cache-matched-key": matched,
               "cache-primary-key": key})
    print(f"stand-in cache restore: {key}: " + (f"restored {matched}" if matched else "no cache"))
    return 0


def cache_save() -> int:
    key, paths = _input("key"), _lines(_input("path"))
    dest = _cache_dir(key)
    if dest.exists():  # a cache key is written once, as on GitHub
        print(f"stand-in cache save: {key} exists; not saved again")
        return 0
    kept = [p for p in paths if Path(p).is_file()]
    _record("cache-save", [key, *kept])
    for path in kept:
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest / path)
    print(f"stand-in cache save: {key}: {', '.join(kept) or 'nothing'}")
    return 0


def upload_artifact() -> int:
    name, paths = _input("name"), _lines(_input("path"))
    files = [f for p in paths for f in ([Path(p)] if Path(p).is_file() else sorted(Path(p).rglob("*")))
             if f.is_file()]
    _record("upload-artifact", [name, *map(str, files)])
    if not files:
        print(f"stand-in upload-artifact: {name}: no files ({_input('if-no-files-found', 'warn')})")
        return 1 if _input("if-no-files-found") == "error" else 0
    dest = _state() / "artifacts" / os.environ.get("GITHUB_RUN_ID", "1") / f"{name}.zip"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w") as z:
        for f in files:
            base = next((Path(p) for p in paths if Path(p).is_dir() and Path(p) in f.parents), f.parent)
            z.write(f, f.relative_to(base))
    print(f"stand-in upload-artifact: {name}: {len(files)} file(s)")
    return 0


def upload_pages_artifact() -> int:
    """The site folder as one tar in a zip named `github-pages`, the artifact deploy-pages reads."""
    name, site = _input("name") or "github-pages", Path(_input("path"))
    if not site.is_dir():
        print(f"stand-in upload-pages-artifact: {site} is not a folder")
        return 1
    files = sorted(f for f in site.rglob("*") if f.is_file())
    _record("upload-pages-artifact", [name, str(site)], files=len(files))
    dest = _state() / "artifacts" / os.environ.get("GITHUB_RUN_ID", "1") / f"{name}.zip"
    dest.parent.mkdir(parents=True, exist_ok=True)
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        for f in files:
            tar.add(f, arcname=str(f.relative_to(site)))
    with zipfile.ZipFile(dest, "w") as z:
        z.writestr("artifact.tar", packed.getvalue())
    print(f"stand-in upload-pages-artifact: {name}: {len(files)} file(s)")
    return 0


def deploy_pages() -> int:
    """Record the deployment of the run's `github-pages` artifact; it must exist, as on GitHub."""
    name = _input("artifact_name") or "github-pages"
    found = _state() / "artifacts" / os.environ.get("GITHUB_RUN_ID", "1") / f"{name}.zip"
    _record("deploy-pages", [name], found=found.is_file())
    if not found.is_file():
        print(f"stand-in deploy-pages: no artifact {name} in this run")
        return 1
    owner, _, repo = os.environ.get("GITHUB_REPOSITORY", "owner/repo").partition("/")
    _output(page_url=f"https://{owner}.github.io/{repo}/")
    print(f"stand-in deploy-pages: {name} recorded, not published")
    return 0


ACTIONS = {"checkout": checkout, "setup-python": setup_python, "cache-restore": cache_restore,
           "cache-save": cache_save, "upload-artifact": upload_artifact,
           "upload-pages-artifact": upload_pages_artifact, "deploy-pages": deploy_pages}
TOOLS = {"nox": nox, "gh": gh, "python": python, "session-python": session_python}


def main(argv: list[str]) -> int:
    verb, rest = argv[0], argv[1:]
    if verb in TOOLS:
        return TOOLS[verb](rest)
    return ACTIONS[verb]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
