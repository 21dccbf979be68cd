"""The modules whose judgement CI depends on, and the mutation score each must keep.

Read by `python -m ci mutation` (`ci.quality.mutation`); the scores each threshold was set
from are in docs/test-quality.md, beside the command that measures them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class MutationTarget:
    """A module whose judgement CI depends on, the tests that must notice when it breaks,
    and the share of its mutants they must kill (equivalent mutants not counted)."""

    source: str  # a .py file or a package directory
    tests: tuple[str, ...]  # few and fast: every mutant of a function reruns the tests reaching it
    threshold: float  # killed / (mutants - equivalent), 0..1


# Equivalent mutants (no test can tell them apart), each with its reason; not counted.
MUTATION_EQUIVALENT = "ci/quality/mutation-equivalent.txt"

# Each threshold sits just below the last measured score (docs/test-quality.md), so a test
# that stops catching a break fails the run; raise it as tests improve.
# The GPU lock's modules were one file when last measured (96.7 %); each keeps its threshold.
_ALLOCATOR_TESTS = ("tests/toolkit/gpu/test_allocator.py", "tests/toolkit/gpu/test_allocator_queue.py",
                    "tests/toolkit/gpu/test_allocator_security.py",
                    "tests/toolkit/gpu/test_allocator_backfill.py")

MUTATION_TARGETS: tuple[MutationTarget, ...] = (
    MutationTarget(source="ci/select/entries.py", tests=("tests/toolkit/select/test_entries.py",),
                   threshold=0.98),
    MutationTarget(source="ci/select/changed.py",
                   tests=("tests/toolkit/select/test_changed.py",
                          "tests/toolkit/select/test_changed_affected.py",
                          "tests/toolkit/select/test_changed_edges.py"),
                   threshold=0.99),
    MutationTarget(source="ci/gpu/allocator.py", tests=_ALLOCATOR_TESTS, threshold=0.96),
    MutationTarget(source="ci/gpu/holders.py", tests=_ALLOCATOR_TESTS, threshold=0.96),
    MutationTarget(source="ci/gpu/tickets.py", tests=_ALLOCATOR_TESTS, threshold=0.96),
    MutationTarget(source="ci/gpu/backfill.py", tests=_ALLOCATOR_TESTS, threshold=0.96),
    MutationTarget(source="ci/results.py", tests=("tests/toolkit/test_results.py",),
                   threshold=0.98),
    MutationTarget(source="ci/select/discover.py", tests=("tests/toolkit/select/test_discover.py",),
                   threshold=0.97),
    # Not test_job_plan_events.py: it runs the workflow's plan step in a git repository outside
    # the mutated copy, where mutmut's hooks in that child process find no configuration and
    # the run stops before its first mutant.
    MutationTarget(source="ci/github/job_plan.py",
                   tests=("tests/toolkit/github/test_job_plan.py",
                          "tests/toolkit/github/test_job_plan_rules.py",
                          "tests/toolkit/github/test_job_plan_cli.py",
                          "tests/toolkit/github/test_job_plan_agree.py"),
                   threshold=0.99),
    MutationTarget(source="slime/utils/ppo_utils.py",
                   tests=("tests/test_policy_loss.py", "tests/test_cispo_loss.py",
                          "tests/test_grpo_advantages.py", "tests/test_gae.py", "tests/test_ppo_kl.py",
                          "tests/test_masked_whiten.py",
                          "tests/test_discounted_returns.py", "tests/test_reinforce_plus_plus.py",
                          "tests/test_log_probs_entropy.py"),
                   threshold=0.97),
    MutationTarget(source="slime/rollout/rm_hub",
                   tests=("tests/test_rm_arith.py", "tests/test_rm_dapo_math.py",
                          "tests/test_rm_deepscaler.py", "tests/test_rm_edges.py", "tests/test_rm_f1.py",
                          "tests/test_rm_gpqa.py", "tests/test_rm_hub_grade.py",
                          "tests/test_rm_math_boxed.py", "tests/test_rm_math_equivalence.py",
                          "tests/test_rm_math_forms.py", "tests/test_rm_math_normalize.py",
                          "tests/utils/test_time_limit.py"),
                   threshold=0.98),
)
