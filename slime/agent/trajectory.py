"""Per-session trees of turns, and the training samples their leaf chains become.

A turn is one request answered by the policy. Its parent is the recorded turn
whose conversation (request + the response we gave) is the longest prefix of
the new request's messages; the new prompt is then the parent's exact tokens
plus only the tokenized new messages, so generated tokens are never
re-tokenized. A retried request becomes a sibling; a forked history becomes a
branch. If the agent's history holds an assistant message the policy did not
generate (edited, truncated, invented), that is drift: the turn starts a new
root from a fresh render and the drift is recorded, because masking those
tokens as generated would train on text the policy never produced.

Every leaf yields one sample: the root's prompt, then every later token once,
with loss mask 1 exactly on generated tokens and the engine's log-probs there.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from slime.agent import chat_template
from slime.agent.messages import Message, ToolSpec
from slime.agent.tokenizer import Tokenizer
from slime.backends.engine.wire import GenerateOutput
from slime.utils.types import Sample
from slime.utils.types import Status as SampleStatus


class UnknownSession(KeyError):
    """No open session has this id."""

    def __str__(self) -> str:
        return f"unknown session {self.args[0]!r}: open one and pass its id as the API key"


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One answered request: its prompt tokens, what the engine generated, what we returned."""

    id: int
    parent: int | None
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    response: Message
    finish_reason: str

    @property
    def conversation(self) -> tuple[Message, ...]:
        """The history an agent resends after this turn."""
        return (*self.messages, self.response)


@dataclass(frozen=True, kw_only=True)
class Drift:
    """A request whose history disagreed with what the policy generated."""

    turn_id: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class TurnPlan:
    """Where a request attaches and the exact prompt tokens to generate from."""

    session_id: str
    parent: int | None
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    prompt_ids: tuple[int, ...]
    drift: str | None = None


Status = Literal["completed", "truncated", "aborted"]


@dataclass(frozen=True, kw_only=True)
class TrajectorySample:
    """One leaf chain as training data (slime's Sample layout: prompt tokens, then response)."""

    session_id: str
    leaf: int
    turns: tuple[int, ...]
    tokens: tuple[int, ...]
    prompt_length: int
    loss_mask: tuple[int, ...]  # over the response part
    rollout_log_probs: tuple[float, ...]  # over the response part; 0.0 where not generated
    status: Status
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def response_length(self) -> int:
        """Tokens after the prompt."""
        return len(self.tokens) - self.prompt_length

    def to_sample(
        self,
        tokenizer: Tokenizer,
        *,
        group_index: int | None = None,
        index: int | None = None,
        label: Any = None,
    ) -> Sample:
        """The training `Sample`: same tokens, mask and log-probs; texts decoded for logging."""
        prompt, response = self.tokens[: self.prompt_length], self.tokens[self.prompt_length :]
        return Sample(
            group_index=group_index,
            index=index,
            prompt=tokenizer.decode(list(prompt), skip_special=False),
            tokens=list(self.tokens),
            response=tokenizer.decode(list(response), skip_special=False),
            response_length=self.response_length,
            label=label,
            reward=self.reward,
            loss_mask=list(self.loss_mask),
            rollout_log_probs=list(self.rollout_log_probs),
            status=SampleStatus(self.status),
            metadata={**self.metadata, "session_id": self.session_id, "turns": list(self.turns)},
        )


@dataclass
class _Session:
    id: str
    metadata: dict[str, Any]
    turns: dict[int, Turn] = field(default_factory=dict)
    drifts: list[Drift] = field(default_factory=list)


class TrajectoryManager:
    """Owns every open session's turn tree; safe to call from several threads."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._sessions: dict[str, _Session] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def open_session(self, session_id: str | None = None, **metadata: Any) -> str:
        """Start recording a session; its id is what the agent passes as API key."""
        sid = session_id or f"sess-{uuid.uuid4().hex}"
        with self._lock:
            if sid in self._sessions:
                raise ValueError(f"session {sid!r} is already open")
            self._sessions[sid] = _Session(id=sid, metadata=dict(metadata))
        return sid

    def has_session(self, session_id: str) -> bool:
        """Whether this id names an open session."""
        return session_id in self._sessions

    def close_session(self, session_id: str) -> None:
        """Forget a session (take its samples first)."""
        with self._lock:
            if self._sessions.pop(session_id, None) is None:
                raise UnknownSession(session_id)

    def _session(self, session_id: str) -> _Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSession(session_id) from None

    def turns(self, session_id: str) -> list[Turn]:
        """The session's turns in the order they were recorded."""
        with self._lock:
            return list(self._session(session_id).turns.values())

    def drifts(self, session_id: str) -> list[Drift]:
        """Requests of this session whose history drifted from what was generated."""
        with self._lock:
            return list(self._session(session_id).drifts)

    def plan(self, session_id: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> TurnPlan:
        """Find the request's parent turn and build its prompt tokens; records nothing."""
        messages, tools = tuple(messages), tuple(tools)
        with self._lock:
            candidates = list(self._session(session_id).turns.values())
        parent: Turn | None = None
        for turn in candidates:
            conv = turn.conversation
            fits = turn.tools == tools and messages[: len(conv)] == conv
            if fits and (parent is None or len(conv) > len(parent.conversation)):
                parent = turn
        new = messages[len(parent.conversation) :] if parent else messages
        if any(m.role == "assistant" for m in new):
            reason = _drift_reason(candidates, messages, tools)
            prompt = self.tokenizer.encode(chat_template.render(messages, tools))
            return TurnPlan(
                session_id=session_id,
                parent=None,
                messages=messages,
                tools=tools,
                prompt_ids=tuple(prompt),
                drift=reason,
            )
        if parent is None:
            prompt = self.tokenizer.encode(chat_template.render(messages, tools))
        else:
            closed = bool(parent.output_ids) and parent.output_ids[-1] in self.tokenizer.eos_ids
            tail = self.tokenizer.encode(chat_template.continuation(new, previous_closed=closed))
            prompt = [*parent.prompt_ids, *parent.output_ids, *tail]
        return TurnPlan(
            session_id=session_id,
            parent=parent.id if parent else None,
            messages=messages,
            tools=tools,
            prompt_ids=tuple(prompt),
        )

    def commit(self, plan: TurnPlan, generation: GenerateOutput, response: Message) -> Turn:
        """Record a finished turn; only whole, validated generations get here."""
        assert generation.finish_kind is not None
        with self._lock:
            session = self._session(plan.session_id)
            turn = Turn(
                id=next(self._ids),
                parent=plan.parent,
                messages=plan.messages,
                tools=plan.tools,
                prompt_ids=plan.prompt_ids,
                output_ids=generation.output_ids,
                output_logprobs=generation.logprobs,
                response=response,
                finish_reason=generation.finish_kind,
            )
            session.turns[turn.id] = turn
            if plan.drift:
                session.drifts.append(Drift(turn_id=turn.id, reason=plan.drift))
            return turn

    def samples(self, session_id: str, *, reward: float | None = None) -> list[TrajectorySample]:
        """One sample per leaf of the session's tree, in recording order."""
        with self._lock:
            session = self._session(session_id)
            turns = dict(session.turns)
            metadata = dict(session.metadata)
        parents = {t.parent for t in turns.values() if t.parent is not None}
        out: list[TrajectorySample] = []
        for leaf in (t for t in turns.values() if t.id not in parents):
            chain = [leaf]
            while chain[-1].parent is not None:
                chain.append(turns[chain[-1].parent])
            chain.reverse()
            out.append(_chain_sample(session_id, chain, reward, metadata))
        return out


def _drift_reason(turns: list[Turn], messages: tuple[Message, ...], tools: tuple[ToolSpec, ...]) -> str:
    """Name the turn whose reply the resent history changed, when there is one."""
    changed = [
        t
        for t in turns
        if t.tools == tools
        and len(t.messages) < len(messages)
        and messages[: len(t.messages)] == t.messages
        and messages[len(t.messages)].role == "assistant"
        and messages[len(t.messages)] != t.response
    ]
    if changed:
        turn = max(changed, key=lambda t: len(t.messages))
        return f"history changes the reply the policy generated in turn {turn.id}"
    return "history holds assistant messages no turn generated"


def _chain_sample(
    session_id: str, chain: list[Turn], reward: float | None, metadata: dict[str, Any]
) -> TrajectorySample:
    root = chain[0]
    mask: list[int] = []
    logprobs: list[float] = []
    covered = len(root.prompt_ids)
    for turn in chain:
        env = len(turn.prompt_ids) - covered  # tool results / user text between generations
        mask += [0] * env
        logprobs += [0.0] * env
        mask += [1] * len(turn.output_ids)
        logprobs += list(turn.output_logprobs)
        covered = len(turn.prompt_ids) + len(turn.output_ids)
    leaf = chain[-1]
    status: Status = "truncated" if leaf.finish_reason == "length" else "completed"
    return TrajectorySample(
        session_id=session_id,
        leaf=leaf.id,
        turns=tuple(t.id for t in chain),
        tokens=(*leaf.prompt_ids, *leaf.output_ids),
        prompt_length=len(root.prompt_ids),
        loss_mask=tuple(mask),
        rollout_log_probs=tuple(logprobs),
        status=status,
        reward=reward,
        metadata=metadata,
    )
