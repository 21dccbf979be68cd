"""act's command line and environment for one workflow of one event (pure builders).

Host mode: every runner label the workflows use maps to `-self-hosted`, so jobs run as
processes on this machine with no image to pull. act copies its own environment into every
job, so it gets a small one built here (never the user's, which may hold real tokens).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.actions.stand_ins import local_repository_args
from ci.registry.workflow_style import Style

# Every label the generated jobs' runs-on names (the hosted runner's, then the GPU runners'):
# each maps to this host. Read from the workflow style, so a new label is never a skipped job.
RUNNER_LABELS = tuple(dict.fromkeys((*Style().hosted_runner, *Style().gpu_runner)))
# What a job may read of the host's environment: enough to run git, Python and jq.
KEPT_ENV = ("HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME")
# What a real session's install reads on the host (--real): where packages come from and which
# certificates to trust. uv verifies TLS against SSL_CERT_FILE, so without it an index behind a
# proxy's certificate fails with "invalid peer certificate: UnknownIssuer".
INSTALL_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PYENV_ROOT",
               "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
INSTALL_PREFIXES = ("PIP_", "UV_")
# Jobs act runs at once when their `needs` allow (a PR's CPU jobs, after the plan): most of a
# job's time is process start-up and git, so two overlap well even on two cores
# (benchmarks/act_events.py measures it against one at a time).
CONCURRENT_JOBS = 2


@dataclass(frozen=True, kw_only=True)
class ActCall:
    """One act invocation: its argv and the environment it runs with."""

    workflow: str
    argv: tuple[str, ...]
    env: Mapping[str, str]


def act_argv(*, act: str, event: str, workflow_file: Path, event_file: Path, clone: Path,
             stand_ins: Path, action_cache: Path, run_id: int, api_url: str,
             secrets: Mapping[str, str], inputs: Mapping[str, str] = {},
             concurrent_jobs: int = CONCURRENT_JOBS) -> list[str]:
    """The argv of `act` for one workflow file and one event (pure); `concurrent_jobs`: how
    many of its jobs whose `needs` are met run at once."""
    argv = [act, event, "--workflows", str(workflow_file), "--eventpath", str(event_file),
            "--directory", str(clone), "--json"]
    for label in RUNNER_LABELS:
        argv += ["--platform", f"{label}=-self-hosted"]
    argv += local_repository_args(stand_ins)
    # The checkout stand-in clones the event's commit into the job's own empty workspace;
    # act's own cache server is off: the cache stand-in keeps caches across act runs.
    argv += ["--no-skip-checkout", "--no-cache-server", "--action-offline-mode",
             "--action-cache-path", str(action_cache), "--concurrent-jobs", str(concurrent_jobs),
             "--env", f"GITHUB_RUN_ID={run_id}", "--env", f"GITHUB_API_URL={api_url}"]
    for name, value in secrets.items():
        argv += ["--secret", f"{name}={value}"]
    for name, value in inputs.items():
        argv += ["--input", f"{name}={value}"]
    return argv


def act_env(host: Mapping[str, str], *, shims: Path, extra: Mapping[str, str],
            installs: bool = False) -> dict[str, str]:
    """The environment act (and so every job) runs with: the shims first on PATH (pure).
    `installs` (--real: real sessions build their venvs) keeps the host's package-index and
    certificate settings too, and still no token."""
    env = {k: host[k] for k in KEPT_ENV if k in host}
    if installs:
        env.update({k: v for k, v in host.items() if k in INSTALL_ENV or k.startswith(INSTALL_PREFIXES)})
    env["PATH"] = f"{shims}:{host.get('PATH', '/usr/bin:/bin')}"
    env.update(extra)
    return env


def quoted(argv: Sequence[str]) -> str:
    """The argv as one shell line (for --dry-run)."""
    import shlex

    return " ".join(shlex.quote(a) for a in argv)
