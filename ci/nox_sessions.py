"""Kept for noxfiles written before `ci.adopt` became a package: a re-export, no code.

An adopted `noxfile.py` of an earlier release starts `from ci.nox_sessions import register`;
it keeps working. `slime-ci adopt` now writes `from ci.adopt.sessions import register`.
"""

from ci.adopt.sessions import register

__all__ = ["register"]
