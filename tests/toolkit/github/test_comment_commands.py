"""PR comment commands: the parser, the authoriser (every refusal) and `plan --event issue_comment`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.errors import UsageError
from ci.github.comment_commands import (
    Allowed,
    Command,
    Context,
    Ignored,
    Malformed,
    Policy,
    Refused,
    allowed_commands,
    authorise,
    load_policy,
    parse_comment,
    parse_policy,
    teams_to_check,
)
from ci.github.job_plan import main
from ci.github.teams import Fetch, lookup

NUM_GPUS = 0

POLICY = parse_policy({"commands": {
    "rerun-test": {"associations": ["OWNER", "MEMBER"], "users": ["Carol"], "teams": ["gpu-ci"]},
    "rerun-failed": {"associations": ["MEMBER"]},
    "run-ci": {"associations": ["OWNER"]},
    "help": {"anyone": True},
}})
REGISTERED = {"tests/e2e/test_tiny_ckpt.py": "ckpt", "tests/test_gae.py": "cpu_unit"}
LABELS = ["run-ci-megatron", "run-ci-ckpt"]
MEMBER = Context(actor="alice", association="MEMBER")


def _verdict(body: str, ctx: Context = MEMBER, policy: Policy | None = POLICY) -> object:
    return authorise(body, ctx, policy, registered=REGISTERED, labels=LABELS)


def test_parser_reads_the_first_line_only() -> None:
    assert parse_comment("/rerun-test tests/x.py\nthanks") == Command(name="rerun-test", arg="tests/x.py")
    assert parse_comment("/rerun-failed  \n") == Command(name="rerun-failed")
    # The gateway workflow starts only on a body that starts with `/`: nothing else is a command.
    assert parse_comment("\n\n  /rerun-failed  ") is None
    assert parse_comment("/run-ci run-ci-ckpt") == Command(name="run-ci", arg="run-ci-ckpt")
    assert parse_comment("/help") == Command(name="help")
    # A command quoted later in a discussion runs nothing.
    assert parse_comment("as I said:\n/rerun-failed") is None
    assert parse_comment("") is None


@pytest.mark.parametrize(("body", "why"), [
    ("/rerun-tests x.py", "unknown command `/rerun-tests`"),
    ("/rerun-test", "/rerun-test takes 1 argument"),
    ("/rerun-test a.py b.py", "/rerun-test takes 1 argument"),
    ("/rerun-failed now", "/rerun-failed takes no arguments"),
    ("/run-ci", "/run-ci takes 1 argument"),
    ("/help me", "/help takes no arguments"),
])
def test_malformed_commands_are_refused_in_one_line(body: str, why: str) -> None:
    parsed = parse_comment(body)
    assert isinstance(parsed, Malformed) and parsed.why.startswith(why)
    verdict = _verdict(body)
    assert isinstance(verdict, Refused) and verdict.why.startswith(why) and "\n" not in verdict.why


def test_allowed_by_association_listed_user_and_team() -> None:
    assert _verdict("/rerun-test tests/e2e/test_tiny_ckpt.py") == Allowed(
        command=Command(name="rerun-test", arg="tests/e2e/test_tiny_ckpt.py"), why="MEMBER may")
    carol = Context(actor="carol", association="CONTRIBUTOR")
    assert isinstance(v := _verdict("/rerun-test tests/test_gae.py", carol), Allowed)
    assert v.why == "carol is listed"
    dave = Context(actor="dave", association="NONE", teams=frozenset({"gpu-ci"}))
    assert isinstance(v := _verdict("/rerun-test tests/test_gae.py", dave), Allowed)
    assert v.why == "team gpu-ci may"


@pytest.mark.parametrize(("body", "ctx", "policy", "why"), [
    ("/rerun-test tests/test_gae.py", Context(actor="eve", association="NONE"), POLICY,
     "eve (NONE) may not use /rerun-test"),
    ("/run-ci run-ci-ckpt", MEMBER, POLICY, "alice (MEMBER) may not use /run-ci"),
    ("/rerun-test tests/test_gae.py", Context(actor="alice", association="MEMBER", from_fork=True),
     POLICY, "/rerun-test never runs on a pull request from a fork"),
    ("/rerun-failed", Context(actor="alice", association="MEMBER", from_fork=True), POLICY,
     "/rerun-failed never runs on a pull request from a fork"),
    ("/rerun-test tests/nope.py", MEMBER, POLICY, "`tests/nope.py` is not a registered test file"),
    ("/rerun-test ../../etc/passwd", MEMBER, POLICY, "`../../etc/passwd` is outside the repository"),
    ("/rerun-test /etc/passwd", MEMBER, POLICY, "`/etc/passwd` is outside the repository"),
    ("/run-ci run-ci-nope", Context(actor="o", association="OWNER"), POLICY,
     "unknown CI label `run-ci-nope`"),
    ("/rerun-failed", Context(actor="alice", association="MEMBER", on_pull_request=False), POLICY,
     "/rerun-failed works only in pull request comments"),
    ("/rerun-failed", MEMBER, None, "comment commands are off"),
    ("/rerun-failed", Context(actor="a b; rm", association="MEMBER"), POLICY, "cannot tell who"),
    ("/rerun-failed", Context(actor="alice", association="ADMIN"), POLICY, "cannot tell who"),
    ("/rerun-failed", MEMBER, parse_policy({"commands": {"help": {"anyone": True}}}),
     "alice (MEMBER) may not use /rerun-failed"),
])
def test_every_refusal(body: str, ctx: Context, policy: Policy | None, why: str) -> None:
    verdict = _verdict(body, ctx, policy)
    assert isinstance(verdict, Refused), verdict
    assert verdict.why.startswith(why) and "\n" not in verdict.why


def test_a_team_only_grant_without_membership_data_is_refused_naming_the_secret() -> None:
    eve = Context(actor="eve", association="NONE", teams_unavailable="set the X secret")
    verdict = _verdict("/rerun-test tests/test_gae.py", eve)
    assert isinstance(verdict, Refused)
    assert verdict.why == ("eve (NONE) may use /rerun-test only through team gpu-ci, which the gateway "
                           "cannot check: set the X secret")
    # Roles and listed users still work without it; a grant with no team refuses as before.
    assert isinstance(_verdict("/rerun-test tests/test_gae.py", Context(
        actor="carol", association="NONE", teams_unavailable="x")), Allowed)
    assert isinstance(v := _verdict("/rerun-failed", eve), Refused) and "may not use" in v.why


def test_teams_are_looked_up_only_when_they_could_change_the_verdict() -> None:
    eve = Context(actor="eve", association="NONE")
    assert teams_to_check("/rerun-test tests/test_gae.py", eve, POLICY) == {"gpu-ci"}
    assert teams_to_check("/rerun-test tests/test_gae.py", MEMBER, POLICY) == frozenset()  # a role admits
    assert teams_to_check("/rerun-failed", eve, POLICY) == frozenset()  # no team in that grant
    assert teams_to_check("/help", eve, POLICY) == {"gpu-ci"}
    assert teams_to_check("no command", eve, POLICY) == frozenset()
    assert teams_to_check("/rerun-test x", eve, None) == frozenset()


def test_team_lookup_answers() -> None:
    env = {"SLIME_CI_TEAMS_TOKEN": "t", "GITHUB_API_URL": "http://api.test/"}
    asked: list[str] = []

    def fetch(status: int, body: object) -> Fetch:
        def answer(url: str, token: str) -> tuple[int, object]:
            asked.append(url)
            assert token == "t"
            return status, body
        return answer

    assert lookup("dave", "acme", ["gpu-ci"], env, fetch(200, {"state": "active"})).teams == {"gpu-ci"}
    assert asked == ["http://api.test/orgs/acme/teams/gpu-ci/memberships/dave"]
    pending = lookup("dave", "acme", ["gpu-ci"], env, fetch(200, {"state": "pending"}))
    assert pending.teams == frozenset() and pending.unavailable is None
    assert lookup("dave", "acme", ["gpu-ci"], env, fetch(404, {})).unavailable is None
    assert "HTTP 401" in str(lookup("dave", "acme", ["gpu-ci"], env, fetch(401, None)).unavailable)
    assert "HTTP 502" in str(lookup("dave", "acme", ["gpu-ci"], env, fetch(502, None)).unavailable)
    assert "SLIME_CI_TEAMS_TOKEN" in str(lookup("dave", "acme", ["gpu-ci"], {}, fetch(200, {})).unavailable)
    assert lookup("dave", "acme", [], {}, fetch(200, {})).unavailable is None  # nothing to ask

    def down(url: str, token: str) -> tuple[int, object]:
        raise OSError("connection refused")

    assert "could not be reached" in str(lookup("dave", "acme", ["gpu-ci"], env, down).unavailable)


def test_help_lists_only_what_its_author_may_use() -> None:
    assert _verdict("/help", Context(actor="eve", association="NONE")) == Allowed(
        command=Command(name="help"), why="anyone may")
    assert allowed_commands(MEMBER, POLICY) == ["rerun-test", "rerun-failed", "help"]
    assert allowed_commands(Context(actor="x", association="MEMBER", from_fork=True), POLICY) == ["help"]
    assert allowed_commands(MEMBER, None) == []
    assert isinstance(_verdict("lgtm"), Ignored)


@pytest.mark.parametrize(("data", "why"), [
    ([], "expected {\"commands\""),
    ({"commands": {"deploy": {}}}, "unknown command 'deploy'"),
    ({"commands": {"help": {"everyone": True}}}, "commands.help: unknown key(s) everyone"),
    ({"commands": {"help": {"anyone": "yes"}}}, "commands.help.anyone must be true or false"),
    ({"commands": {"rerun-test": {"anyone": True}}}, "commands.rerun-test: `anyone` is only for help"),
    ({"commands": {"run-ci": {"associations": ["ADMIN"]}}}, "unknown association(s) ADMIN"),
    ({"commands": {"run-ci": {"users": "alice"}}}, "commands.run-ci.users must be a list"),
])
def test_a_bad_policy_is_one_line(data: object, why: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_policy(data)
    assert why in str(err.value)


def test_the_repository_policy_loads_and_a_broken_file_is_bad_input(tmp_path: Path) -> None:
    policy = load_policy(REPO)
    assert policy is not None and policy.grants["help"].anyone
    assert load_policy(tmp_path) is None
    (tmp_path / ".github").mkdir()
    (tmp_path / ".github" / "ci-access.json").write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_policy(tmp_path)


SHA = "0123456789abcdef0123456789abcdef01234567"


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["--event", "issue_comment", "--root", str(REPO), "--json", "--pr", "7",
                 "--sha", SHA, *args]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_plan_resolves_a_rerun_test_through_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan(capsys, "--comment", "/rerun-test tests/e2e/test_tiny_ckpt.py", "--actor", "alice",
                "--association", "MEMBER", "--no-fork")
    assert out["verdict"] == "allowed" and out["suite"] == "ckpt" and out["tier"] == "gpu"
    assert out["command_line"] == "nox -s ckpt -- --only tests/e2e/test_tiny_ckpt.py"
    assert out["num_gpus"] == 2 and len(out["test_args"]) == 5  # type: ignore[arg-type]
    assert out["dispatch"] == {"workflow": "run-ci-file.yml", "inputs": {
        "pr": "7", "sha": SHA, "suite": "ckpt", "only": "tests/e2e/test_tiny_ckpt.py"}}


def test_plan_run_ci_adds_the_label_and_dispatches_its_suite(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan(capsys, "--comment", "/run-ci run-ci-megatron", "--actor", "o", "--association", "OWNER")
    assert out["add_label"] == "run-ci-megatron" and out["command_line"] == "nox -s megatron"
    assert out["dispatch"]["inputs"]["suite"] == "megatron"  # type: ignore[index]


@pytest.mark.parametrize(("args", "why"), [
    (["--actor", "eve", "--association", "NONE", "--comment", "/rerun-failed"], "eve (NONE) may not"),
    (["--actor", "alice", "--association", "MEMBER", "--fork", "--comment", "/rerun-failed"],
     "/rerun-failed never runs on a pull request from a fork"),
])
def test_plan_refusals_dispatch_nothing(capsys: pytest.CaptureFixture[str], args: list[str],
                                        why: str) -> None:
    out = _plan(capsys, *args)
    assert out["verdict"] == "refused" and str(out["why"]).startswith(why)
    assert out["dispatch"] is None and out["add_label"] is None and out["rerun_failed"] is False
    assert out["reaction"] == "confused"


def test_plan_bisect_dispatches_the_bisect_of_a_registered_file(capsys: pytest.CaptureFixture[str]) -> None:
    """/bisect runs main's code over the monitor's streak of the file: its suite and tier come
    from the registry, as /rerun-test's do, under the repository's policy (MEMBER may)."""
    out = _plan(capsys, "--comment", "/bisect tests/e2e/test_tiny_ckpt.py", "--actor", "alice",
                "--association", "MEMBER", "--no-fork")
    assert out["verdict"] == "allowed" and out["reaction"] == "rocket"
    assert out["dispatch"] == {"workflow": "bisect.yml", "inputs": {
        "suite": "ckpt", "tier": "gpu", "entry": "tests/e2e/test_tiny_ckpt.py", "trigger": "comment"}}
    assert out["command_line"] == ("python -m ci bisect --suite ckpt --entry tests/e2e/test_tiny_ckpt.py "
                                   "--from-monitor")


@pytest.mark.parametrize(("args", "why"), [
    (["--actor", "eve", "--association", "CONTRIBUTOR"], "eve (CONTRIBUTOR) may not use /bisect"),
    (["--actor", "alice", "--association", "MEMBER", "--fork"], "/bisect never runs on a pull request from a fork"),
])
def test_plan_bisect_keeps_the_access_policy(capsys: pytest.CaptureFixture[str], args: list[str],
                                             why: str) -> None:
    out = _plan(capsys, *args, "--comment", "/bisect tests/e2e/test_tiny_ckpt.py")
    assert out["verdict"] == "refused" and str(out["why"]).startswith(why) and out["dispatch"] is None


def test_bisect_names_a_registered_file() -> None:
    policy = parse_policy({"commands": {"bisect": {"associations": ["MEMBER"]}}})
    assert isinstance(_verdict("/bisect tests/test_gae.py", policy=policy), Allowed)
    for body, why in (("/bisect tests/nope.py", "is not a registered test file"),
                      ("/bisect ../etc/passwd", "outside the repository"),
                      ("/bisect", "/bisect takes 1 argument")):
        verdict = _verdict(body, policy=policy)
        assert isinstance(verdict, Refused) and why in verdict.why, (body, verdict)
    with pytest.raises(UsageError, match="`anyone` is only for help"):
        parse_policy({"commands": {"bisect": {"anyone": True}}})


def test_plan_comment_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="needs --actor, --association"):
        main(["--event", "issue_comment", "--comment", "/help", "--root", str(REPO)])
    with pytest.raises(UsageError, match="expected a full 40-hex commit id"):
        main(["--event", "issue_comment", "--comment", "/help", "--actor", "a",
              "--association", "NONE", "--sha", "HEAD", "--root", str(REPO)])
    with pytest.raises(UsageError, match="only apply to --event issue_comment"):
        main(["--event", "push", "--actor", "a", "--root", str(REPO)])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
