"""Port blocks: every GPU entry gets its own block of consecutive ports (Ray, torch.distributed).

The one owner of the block layout's numbers: the runner hands each entry
`SLIME_CI_PORT_BASE`, and the private Ray head (slime/utils/external_utils/ray_head.py)
lays its ports out inside a block of the same size.
"""

from __future__ import annotations

from collections.abc import Sequence

PORT_BLOCK = 200  # ports reserved per GPU entry (Ray head, dashboard, workers…)
PORT_FLOOR = 20000  # first port of GPU 0's block


def port_base(devices: Sequence[int]) -> int:
    """First port of the block of an entry holding `devices`: keyed by its lowest GPU id,
    which no concurrent entry on this host holds."""
    return PORT_FLOOR + min(devices) * PORT_BLOCK
