"""The old name of `ci.event_plan` (which CI job runs when; what `python -m ci plan` runs).

Kept while code outside this checkout's own modules still imports `ci.triggers`: it is the
same module object, so every name (private ones too) resolves as before. Import
`ci.event_plan` in new code.
"""

import sys

from ci import event_plan

sys.modules[__name__] = event_plan
