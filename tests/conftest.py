"""Hooks every test file shares.

Gloo rank tests (`tests/_gloo.py`) fork their ranks from a copy of the test process taken
when collection ends: every module the file imports is loaded by then and no test has
started a thread yet.
"""

import sys


def pytest_collection_finish(session):
    gloo = sys.modules.get("_gloo")
    if gloo is not None:
        gloo.start_zygote()


def pytest_sessionfinish(session, exitstatus):
    gloo = sys.modules.get("_gloo")
    if gloo is not None:
        gloo.stop_zygote()
