"""Trajectory trees: retries and forks become the right leaf chains, drift is detected."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest

from slime.agent import chat_template
from slime.agent.messages import Message, ToolCall, ToolSpec
from slime.agent.tokenizer import IM_END, ByteTokenizer
from slime.agent.trajectory import TrajectoryManager, TrajectorySample, Turn, UnknownSession
from slime.backends.engine.wire import FinishReason, GenerateOutput, MetaInfo

NUM_GPUS = 0

TOK = ByteTokenizer()
TOOLS = (ToolSpec.make(name="search", description="Search the web.", parameters={"type": "object"}),)
SYSTEM = Message(role="system", content="Be brief.")
USER = Message(role="user", content="Find the capital of France.")


def generation(text: str, *, closed: bool = True, salt: int = 0) -> GenerateOutput:
    ids = TOK.encode(text) + ([TOK.token_id(IM_END)] if closed else [])
    logprobs = [-0.1 - 0.01 * ((i + salt) % 9) for i in range(len(ids))]
    return GenerateOutput(
        text=text,
        output_ids=tuple(ids),
        meta_info=MetaInfo(
            finish_reason=FinishReason(type="stop" if closed else "length"),
            output_token_logprobs=tuple((lp, t, None) for lp, t in zip(logprobs, ids, strict=True)),
        ),
    )


def answer(
    mgr: TrajectoryManager,
    sid: str,
    messages: Sequence[Message],
    text: str,
    *,
    call: str | None = None,
    **kw: object,
) -> Turn:
    """Plan and commit one turn, as the adapter does."""
    plan = mgr.plan(sid, messages, TOOLS)
    calls = (ToolCall.make(id=call, name="search", arguments={"q": "capital"}),) if call else ()
    return mgr.commit(plan, generation(text, **kw), Message(role="assistant", content=text, tool_calls=calls))  # type: ignore[arg-type]


def tool_result(call: str, content: str) -> Message:
    return Message(role="tool", content=content, tool_call_id=call)


def check(sample: TrajectorySample, chain: Sequence[Turn]) -> None:
    """Every token once; mask 1 exactly on the chain's outputs; log-probs where generated."""
    leaf = chain[-1]
    assert sample.tokens == (*leaf.prompt_ids, *leaf.output_ids)
    assert sample.turns == tuple(t.id for t in chain)
    assert sample.prompt_length == len(chain[0].prompt_ids)
    mask = [0] * len(sample.tokens)
    lps = [0.0] * len(sample.tokens)
    for t in chain:
        # Each turn's prompt is its parent's tokens exactly, then the new messages.
        assert sample.tokens[: len(t.prompt_ids)] == t.prompt_ids
        for i, lp in enumerate(t.output_logprobs):
            mask[len(t.prompt_ids) + i] = 1
            lps[len(t.prompt_ids) + i] = lp
    assert list(sample.loss_mask) == mask[sample.prompt_length :]
    assert list(sample.rollout_log_probs) == lps[sample.prompt_length :]


@pytest.fixture
def mgr() -> TrajectoryManager:
    return TrajectoryManager(TOK)


def test_two_turn_chain_reuses_generated_tokens(mgr: TrajectoryManager) -> None:
    sid = mgr.open_session()
    first = answer(mgr, sid, [SYSTEM, USER], "Searching.", call="c1")
    history = [SYSTEM, USER, first.response, tool_result("c1", "Paris")]
    second = answer(mgr, sid, history, "Paris.")
    assert second.parent == first.id
    tail = chat_template.continuation([tool_result("c1", "Paris")], previous_closed=True)
    assert second.prompt_ids == (*first.prompt_ids, *first.output_ids, *TOK.encode(tail))
    (sample,) = mgr.samples(sid, reward=1.0)
    check(sample, [first, second])
    assert sample.reward == 1.0
    assert sample.status == "completed"
    assert sum(sample.loss_mask) == len(first.output_ids) + len(second.output_ids)


def test_retry_of_first_turn_is_a_sibling_root(mgr: TrajectoryManager) -> None:
    sid = mgr.open_session()
    a = answer(mgr, sid, [SYSTEM, USER], "First try.")
    b = answer(mgr, sid, [SYSTEM, USER], "Second try.", salt=3)
    assert a.parent is None and b.parent is None
    assert a.prompt_ids == b.prompt_ids
    samples = mgr.samples(sid)
    assert [s.leaf for s in samples] == [a.id, b.id]
    check(samples[0], [a])
    check(samples[1], [b])


def test_forks_and_retries_give_one_sample_per_leaf(mgr: TrajectoryManager) -> None:
    sid = mgr.open_session()
    root = answer(mgr, sid, [SYSTEM, USER], "Searching.", call="c1")
    base = [SYSTEM, USER, root.response]
    paris = answer(mgr, sid, [*base, tool_result("c1", "Paris")], "Paris.")
    retry = answer(mgr, sid, [*base, tool_result("c1", "Paris")], "It is Paris.", salt=5)
    lyon = answer(mgr, sid, [*base, tool_result("c1", "Lyon?")], "Unsure.", call="c2")
    deeper = answer(
        mgr,
        sid,
        [*base, tool_result("c1", "Lyon?"), lyon.response, tool_result("c2", "Paris")],
        "Paris, then.",
    )
    assert [t.parent for t in (paris, retry, lyon, deeper)] == [root.id, root.id, root.id, lyon.id]
    samples = {s.leaf: s for s in mgr.samples(sid)}
    assert set(samples) == {paris.id, retry.id, deeper.id}
    check(samples[paris.id], [root, paris])
    check(samples[retry.id], [root, retry])
    check(samples[deeper.id], [root, lyon, deeper])
    # Siblings share the parent's tokens, each exactly once, and differ after it.
    shared = len(root.prompt_ids) + len(root.output_ids)
    assert samples[paris.id].tokens[:shared] == samples[retry.id].tokens[:shared]
    assert samples[paris.id].tokens != samples[retry.id].tokens
    assert mgr.drifts(sid) == []


def test_edited_assistant_history_is_drift_and_a_new_root(mgr: TrajectoryManager) -> None:
    sid = mgr.open_session()
    first = answer(mgr, sid, [SYSTEM, USER], "Searching.", call="c1")
    edited = Message(role="assistant", content="Searching hard.", tool_calls=first.response.tool_calls)
    history = [SYSTEM, USER, edited, tool_result("c1", "Paris")]
    second = answer(mgr, sid, history, "Paris.")
    assert second.parent is None
    (drift,) = mgr.drifts(sid)
    assert drift.turn_id == second.id
    assert f"generated in turn {first.id}" in drift.reason
    # The drifted turn is rendered whole; the edited text is prompt, never trained on.
    assert second.prompt_ids == tuple(TOK.encode(chat_template.render(history, TOOLS)))
    samples = {s.leaf: s for s in mgr.samples(sid)}
    check(samples[second.id], [second])
    assert samples[second.id].loss_mask == (1,) * len(second.output_ids)


def test_changed_tool_arguments_are_drift(mgr: TrajectoryManager) -> None:
    sid = mgr.open_session()
    first = answer(mgr, sid, [SYSTEM, USER], "Searching.", call="c1")
    (call,) = first.response.tool_calls
    altered = Message(
        role="assistant",
        content=first.response.content,
        tool_calls=(ToolCall.make(id=call.id, name=call.name, arguments={"q": "other"}),),
    )
    second = answer(mgr, sid, [SYSTEM, USER, altered, tool_result("c1", "x")], "Done.")
    assert second.parent is None
    assert len(mgr.drifts(sid)) == 1


def test_resent_arguments_in_another_json_spelling_are_not_drift(mgr: TrajectoryManager) -> None:
    sid = mgr.open_session()
    first = answer(mgr, sid, [SYSTEM, USER], "Searching.", call="c1")
    (call,) = first.response.tool_calls
    respelled = ToolCall.make(id=call.id, name=call.name, arguments={"q": "capital"})
    assert respelled == call
    second = answer(mgr, sid, [SYSTEM, USER, first.response, tool_result("c1", "Paris")], "Paris.")
    assert second.parent == first.id


def test_assistant_history_with_no_turn_is_drift(mgr: TrajectoryManager) -> None:
    sid = mgr.open_session()
    invented = Message(role="assistant", content="I already answered.")
    turn = answer(mgr, sid, [SYSTEM, USER, invented, Message(role="user", content="Again?")], "Yes.")
    assert turn.parent is None
    assert "no turn generated" in mgr.drifts(sid)[0].reason


def test_truncated_parent_gets_its_end_marker_as_a_prompt_token(mgr: TrajectoryManager) -> None:
    sid = mgr.open_session()
    cut = answer(mgr, sid, [SYSTEM, USER], "Searching and", closed=False)
    assert cut.finish_reason == "length"
    follow = answer(mgr, sid, [SYSTEM, USER, cut.response, Message(role="user", content="Go on.")], "Paris.")
    assert follow.parent == cut.id
    after = follow.prompt_ids[len(cut.prompt_ids) + len(cut.output_ids)]
    assert after == TOK.token_id(IM_END)
    (sample,) = mgr.samples(sid)
    check(sample, [cut, follow])
    assert sample.loss_mask[len(cut.output_ids)] == 0


def test_sessions_are_isolated_and_closed(mgr: TrajectoryManager) -> None:
    a = mgr.open_session("a")
    b = mgr.open_session("b")
    with pytest.raises(ValueError, match="already open"):
        mgr.open_session("a")
    first = answer(mgr, a, [SYSTEM, USER], "Searching.", call="c1")
    # Session b cannot attach to a's turn, so the same history is drift there.
    other = answer(mgr, b, [SYSTEM, USER, first.response, tool_result("c1", "P")], "P.")
    assert other.parent is None and len(mgr.drifts(b)) == 1 and mgr.drifts(a) == []
    mgr.close_session(a)
    with pytest.raises(UnknownSession, match="unknown session 'a'"):
        mgr.samples(a)
    with pytest.raises(UnknownSession):
        mgr.close_session(a)
    assert len(mgr.samples(b)) == 1


def test_empty_session_has_no_samples(mgr: TrajectoryManager) -> None:
    assert mgr.samples(mgr.open_session()) == []


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
