"""The table a person reads and the JSON document a machine reads, from the verdicts and figures."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slime.device_check.judge import Verdict


def table(verdicts: Sequence[Verdict], env: Mapping[str, Any]) -> str:
    """One row per check (result, figures, note), then every failed condition, one per line."""
    head = (f"cuda_check on {env.get('device_name', env.get('device'))} | torch {env.get('torch')} | "
            f"backend {env.get('backend')} | world size {env.get('world_size')}")
    rows = [("check", "result", "figures", "note")]
    rows += [(v.title, "ok" if v.ok else "FAILED", v.summary, v.note) for v in verdicts]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [head, ""]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3])
        if r is rows[0]:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 4)
    failed = [v for v in verdicts if not v.ok]
    if failed:
        lines.append("")
        for v in failed:
            lines += [f"FAILED {v.title}: {why}" for why in v.failures]
    held = sum(v.ok for v in verdicts)
    lines += ["", f"{held} of {len(verdicts)} checks held"]
    return "\n".join(lines)


def _plain(x: Any) -> Any:
    # JSON has no NaN or infinity: write them as null rather than emit invalid JSON.
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def document(verdicts: Sequence[Verdict], figures: Mapping[str, Any],
             options: Mapping[str, Any]) -> dict[str, Any]:
    """Everything measured and decided: `ok`, per-check verdicts, the figures, the options used."""
    doc: dict[str, Any] = _plain({
        "ok": all(v.ok for v in verdicts),
        "checks": {v.name: {"title": v.title, "ok": v.ok, "summary": v.summary, "note": v.note,
                            "failures": list(v.failures)} for v in verdicts},
        "figures": figures,
        "options": options,
    })
    return doc


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """Written whole, then renamed into place: a reader never sees half a document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
    tmp.replace(path)
