"""Record per-step gradient norms and losses on one layout; compare them on replay on another.

`--ci-save-grad-norm DIR` writes `DIR/grad_norm.jsonl` (one line per step);
`--ci-load-grad-norm DIR` replays the same recorded rollouts on a different
parallel layout and stops at the first step whose gradient norm differs by more
than `grad_rtol` (1 %) or whose loss differs by more than `loss_rtol`.

Loss tolerance: 1e-4 relative plus 1e-6 absolute. Layouts change only the order of
float32 sums (across ranks, micro-batches, TP shards), which moves a loss of order 1 by
about 1e-6; a normalisation bug moves it by whole percent. The absolute part is for
losses that are zero in exact arithmetic (a GRPO policy loss on policy: group-normalised
advantages sum to zero), whose recorded value is float noise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

FILE = "grad_norm.jsonl"
GRAD_RTOL = 0.01
LOSS_RTOL = 1e-4
LOSS_ATOL = 1e-6


class GradNormMismatch(AssertionError):
    """A replayed step whose gradient norm or loss left the tolerance; one line with the numbers."""


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    step: int
    grad_norm: float
    loss: float


def read_records(directory: str | Path) -> dict[int, StepRecord]:
    path = Path(directory) / FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: record it with --ci-save-grad-norm {directory}")
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = StepRecord(**json.loads(line))
            out[rec.step] = rec
    return out


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


class GradNormRecorder:
    """Call `record(step, grad_norm, loss)` every step on every rank (values already global)."""

    def __init__(
        self,
        *,
        save_dir: str | Path | None = None,
        load_dir: str | Path | None = None,
        write: bool = True,
        grad_rtol: float = GRAD_RTOL,
        loss_rtol: float = LOSS_RTOL,
        loss_atol: float = LOSS_ATOL,
    ) -> None:
        self.save_path = Path(save_dir) / FILE if save_dir is not None else None
        # Only one rank should write (write=rank == 0); every rank compares, so all
        # ranks stop together instead of peers hanging in the next collective.
        self.write = write
        if self.save_path is not None and write:
            self.save_path.parent.mkdir(parents=True, exist_ok=True)
            self.save_path.write_text("")
        self.reference = read_records(load_dir) if load_dir is not None else None
        self.load_dir = load_dir
        self.grad_rtol = grad_rtol
        self.loss_rtol = loss_rtol
        self.loss_atol = loss_atol
        self.checked = 0

    def record(self, step: int, grad_norm: float, loss: float) -> None:
        if not (math.isfinite(grad_norm) and math.isfinite(loss)):
            raise GradNormMismatch(f"step {step}: grad norm {grad_norm} / loss {loss} not finite")
        if self.save_path is not None and self.write:
            with self.save_path.open("a") as f:
                f.write(json.dumps({"step": step, "grad_norm": grad_norm, "loss": loss}) + "\n")
        if self.reference is None:
            return
        ref = self.reference.get(step)
        if ref is None:
            raise GradNormMismatch(f"step {step}: no reference step in {self.load_dir} "
                                   f"(it has steps {min(self.reference)}..{max(self.reference)})")
        g, lo = _rel(grad_norm, ref.grad_norm), _rel(loss, ref.loss)
        if g > self.grad_rtol:
            raise GradNormMismatch(f"step {step}: grad norm {grad_norm:.6g} vs reference {ref.grad_norm:.6g} "
                                   f"({g:.2%} apart, tolerance {self.grad_rtol:.2%})")
        if abs(loss - ref.loss) > self.loss_rtol * abs(ref.loss) + self.loss_atol:
            raise GradNormMismatch(f"step {step}: loss {loss:.8g} vs reference {ref.loss:.8g} "
                                   f"(relative {lo:.2e}, tolerance {self.loss_rtol:.0e} "
                                   f"+ {self.loss_atol:.0e} absolute)")
        self.checked += 1
