"""Sessions of this repository, from .slime-ci/suites.py through the slime-ci toolkit.

Written by `slime-ci adopt`; re-run it to update. `nox -l` lists the sessions.
"""

from ci.nox_sessions import register

# The toolkit each session installs (pip requirement, local path or VCS URL).
TOOLKIT = 'slime-ci==0.1.0'

register(__file__, toolkit=TOOLKIT)
