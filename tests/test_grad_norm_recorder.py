"""The grad-norm recorder: what it writes, and the tolerances it replays with (1 % grad norm, loss 1e-4 + 1e-6)."""

import sys

import pytest

from slime.backends.fsdp.grad_norm import GradNormMismatch, GradNormRecorder, read_records

NUM_GPUS = 0


def _recorded(tmp_path, rows=((0, 2.0, 4.0), (1, 1.5, 3.0), (2, 1.0, 1e-9))):
    rec = GradNormRecorder(save_dir=tmp_path)
    for step, g, loss in rows:
        rec.record(step, g, loss)
    return tmp_path


def test_records_every_step(tmp_path):
    recs = read_records(_recorded(tmp_path))
    assert [(r.step, r.grad_norm, r.loss) for r in recs.values()] == [(0, 2.0, 4.0), (1, 1.5, 3.0), (2, 1.0, 1e-9)]


def test_replay_within_tolerance_passes(tmp_path):
    rec = GradNormRecorder(load_dir=_recorded(tmp_path))
    rec.record(0, 2.0 * 1.009, 4.0 * (1 + 9e-5))
    rec.record(1, 1.5, 3.0)
    rec.record(2, 1.0, -5e-7)  # a zero loss recorded as float noise on both sides
    assert rec.checked == 3


@pytest.mark.parametrize(("step", "g", "loss", "message"), [
    (0, 2.0 * 1.011, 4.0, "step 0: grad norm 2.022 vs reference 2 (1.10% apart, tolerance 1.00%)"),
    (1, 1.5, 3.0 * (1 + 2e-4), "step 1: loss 3.0006 vs reference 3 (relative 2.00e-04, tolerance 1e-04 "
                                "+ 1e-06 absolute)"),
    (2, 1.0, 2e-6, "step 2: loss 2e-06 vs reference 1e-09"),
    (5, 1.0, 1.0, "step 5: no reference step in"),
    (0, float("nan"), 1.0, "step 0: grad norm nan / loss 1.0 not finite"),
])
def test_mismatch_is_one_line_with_the_numbers(tmp_path, step, g, loss, message):
    rec = GradNormRecorder(load_dir=_recorded(tmp_path))
    with pytest.raises(GradNormMismatch) as info:
        rec.record(step, g, loss)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_missing_reference_says_how_to_record(tmp_path):
    with pytest.raises(FileNotFoundError, match="record it with --ci-save-grad-norm"):
        GradNormRecorder(load_dir=tmp_path / "none")


def test_only_the_writing_rank_writes(tmp_path):
    GradNormRecorder(save_dir=tmp_path / "a", write=False).record(0, 1.0, 1.0)
    assert not (tmp_path / "a").exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", *sys.argv[1:]]))
