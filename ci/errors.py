"""Errors a user can fix. Entry points catch `CIError`, print one line, exit with its code."""

from __future__ import annotations

# Exit codes mean the same thing in every command of the toolkit.
EXIT_OK = 0
EXIT_FAILED = 1  # tests ran and something failed
EXIT_USAGE = 2  # bad input: fix the command line, the registry or the checkout
EXIT_NOTHING = 3  # a session whose suite has nothing registered
EXIT_STORE = 4  # the run-history store cannot be used (unreachable, corrupt, newer schema)
EXIT_CLUSTER = 5  # the Ray cluster became unreachable mid-run (results so far are recorded)
EXIT_TIMEOUT = 124  # gave up waiting (GPU lock), as timeout(1) does
EXIT_INTERRUPTED = 130


class CIError(Exception):
    """A problem the user can fix; the message says how."""

    exit_code = EXIT_USAGE


class UsageError(CIError):
    """Bad arguments or a bad request."""


class NothingRegistered(CIError):
    exit_code = EXIT_NOTHING


class WaitTimeout(CIError):
    exit_code = EXIT_TIMEOUT


class StoreError(CIError):
    """The run-history store cannot be opened or read; a test run only warns about it."""

    exit_code = EXIT_STORE


class ClusterUnreachable(CIError):
    """The cluster a run was using stopped answering; what finished before is recorded."""

    exit_code = EXIT_CLUSTER
