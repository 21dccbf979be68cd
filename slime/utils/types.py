"""`Sample`: one prompt's response as it travels from rollout to training."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """Where a sample stands; only COMPLETED and TRUNCATED samples carry a full response."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


# Finish reasons of the rollout engine's `meta_info["finish_reason"]["type"]`.
_FINISH_REASONS = {
    "stop": Status.COMPLETED,
    "length": Status.TRUNCATED,
    "abort": Status.ABORTED,
}


def status_from_finish_reason(reason: str | dict[str, Any] | None) -> Status:
    """Map an engine finish reason (`"length"` or `{"type": "length", ...}`) to a status."""
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind not in _FINISH_REASONS:
        raise ValueError(
            f"unknown finish reason {reason!r}; expected one of {', '.join(_FINISH_REASONS)}"
        )
    return _FINISH_REASONS[kind]


@dataclass
class Sample:
    """A prompt, its generated response and everything training needs about it.

    Mutable on purpose: the rollout fills it in step by step. `tokens` holds
    prompt and response; the last `response_length` of them are the response.
    """

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    weight_versions: list[str] = field(default_factory=list)
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    # Fields written by a newer (or older) version of the framework; kept so a
    # dump → load → dump round trip loses nothing.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def prompt_length(self) -> int:
        """Number of prompt tokens."""
        return len(self.tokens) - self.response_length

    def apply_finish_reason(self, reason: str | dict[str, Any] | None) -> None:
        """Set `status` from the engine's finish reason."""
        self.status = status_from_finish_reason(reason)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-friendly status); unknown fields come back at top level."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out["status"] = self.status.value
        out = {k: _copy(v) for k, v in out.items()}
        for key, value in self.extra.items():
            out.setdefault(key, _copy(value))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        """Inverse of `to_dict`; keys this version does not know land in `extra`."""
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: _copy(v) for k, v in data.items() if k in known}
        if "status" in kwargs:
            kwargs["status"] = Status(kwargs["status"])
        extra = {k: _copy(v) for k, v in data.items() if k not in known}
        return cls(**kwargs, extra=extra)


def _copy(value: Any) -> Any:
    # Lists and dicts are copied so a dict made from a sample never aliases it.
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value
