"""`Sample`: status, dict round trip (unknown fields kept), finish-reason mapping."""

import json
import sys

import pytest

from slime.utils.types import Sample, Status, status_from_finish_reason

NUM_GPUS = 0


def _sample():
    return Sample(
        group_index=3, index=12, prompt=[{"role": "user", "content": "2+2?"}], tokens=[1, 2, 3, 4],
        response="4", response_length=1, label="4", reward=1.0, loss_mask=[1],
        rollout_log_probs=[-0.1], weight_versions=["v1"], status=Status.COMPLETED,
        metadata={"source": "gsm8k"},
    )


def test_round_trip_is_lossless():
    s = _sample()
    assert Sample.from_dict(s.to_dict()) == s


def test_dict_is_json_ready():
    d = _sample().to_dict()
    assert d["status"] == "completed"
    assert json.loads(json.dumps(d)) == d


def test_unknown_fields_survive_a_round_trip():
    d = _sample().to_dict()
    d["teacher_log_probs"] = [-0.5]
    d["multimodal"] = {"image": "x.png"}
    back = Sample.from_dict(d)
    assert back.extra == {"teacher_log_probs": [-0.5], "multimodal": {"image": "x.png"}}
    assert back.to_dict() == d


def test_dict_does_not_alias_the_sample():
    s = _sample()
    d = s.to_dict()
    d["tokens"].append(99)
    d["metadata"]["source"] = "other"
    assert s.tokens == [1, 2, 3, 4]
    assert s.metadata == {"source": "gsm8k"}


def test_missing_fields_take_defaults():
    s = Sample.from_dict({"prompt": "hi"})
    assert s.status is Status.PENDING
    assert s.tokens == []
    assert s.loss_mask is None


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        ("stop", Status.COMPLETED),
        ("length", Status.TRUNCATED),
        ("abort", Status.ABORTED),
        ({"type": "length", "length": 128}, Status.TRUNCATED),
        ({"type": "stop", "matched": 2}, Status.COMPLETED),
    ],
)
def test_finish_reasons(reason, status):
    assert status_from_finish_reason(reason) is status
    s = Sample()
    s.apply_finish_reason(reason)
    assert s.status is status


@pytest.mark.parametrize("reason", ["eos", None, {"type": "weird"}, {}])
def test_unknown_finish_reason_is_an_error(reason):
    with pytest.raises(ValueError, match="unknown finish reason"):
        status_from_finish_reason(reason)


def test_prompt_length():
    assert _sample().prompt_length == 3


def test_status_values_are_stable_strings():
    # Dumped rollouts are read back by later versions: these values are a file format.
    assert [s.value for s in Status] == ["pending", "completed", "truncated", "aborted", "failed"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
