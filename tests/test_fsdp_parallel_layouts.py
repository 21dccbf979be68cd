"""Every parallel layout gives the same gradient norms and losses on the same data.

Reference: one rank, one micro-batch, recorded with the grad-norm recorder
(`--ci-save-grad-norm`). Replayed (`--ci-load-grad-norm`) on DP2, DP4 (FSDP2), TP2
(DTensor tensor parallel), DP2 × TP2 and two micro-batches (on one and two ranks),
on real gloo ranks: each step within 1 % on grad norm and 1e-4 relative on loss,
with per-token and per-sample loss. A deliberately wrong normalisation (mean of
per-chunk means) must be caught on every layout that splits the batch.
"""

import sys

import pytest
from _gloo import preload, run_ranks
from _tiny_qwen import RANK_MODULES

preload(*RANK_MODULES, "slime.backends.fsdp.parallel", "slime.backends.fsdp.grad_norm")

NUM_GPUS = 0
STEPS = 3
ROWS = 8
MODES = {"per_token": True, "per_sample": False}

# name: (world, tp, micro-batches)
LAYOUTS = {
    "dp2": (2, 1, 1),
    "dp4": (4, 1, 1),
    "tp2": (2, 2, 1),
    "dp2xtp2": (4, 2, 1),
    "mb2": (1, 1, 2),
    "dp2_mb2": (2, 1, 2),
}


def global_batch(step):
    """Same rows on every layout; short answers first, long ones last, so chunks differ in tokens."""
    import torch
    from _tiny_qwen import VOCAB

    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (ROWS, 16), generator=g)
    mask = torch.zeros(ROWS, 16)
    for r in range(ROWS):
        n = 4 + r if r < ROWS // 2 else 13 + r % 3  # loss tokens per row: 4..7, then 13..15
        mask[r, 1:1 + n] = 1.0
    return ids, mask


def train(rank, world, tp, n_micro, *, per_token, wrong, save_dir, load_dir):
    import torch
    import torch.distributed as dist
    from _tiny_qwen import tiny_qwen2, token_losses

    from slime.backends.fsdp.grad_norm import GradNormMismatch, GradNormRecorder
    from slime.backends.fsdp.parallel import (
        build_mesh,
        clip_grads,
        grad_norm,
        layout_for,
        micro_batches,
        normalise_loss,
        parallelize,
    )

    layout = layout_for(world, tp)
    mesh = build_mesh(layout, "cpu")
    model = parallelize(tiny_qwen2(seed=0), mesh)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    recorder = GradNormRecorder(save_dir=save_dir, load_dir=load_dir, write=rank == 0)
    dp_rank = mesh["dp"].get_local_rank()
    try:
        for step in range(STEPS):
            ids, mask = global_batch(step)
            global_tokens = int(mask[:, 1:].sum())
            mine = micro_batches(ROWS, layout.dp)[dp_rank]  # TP ranks of one dp group share rows
            ids, mask = ids[mine], mask[mine]
            loss_value = torch.zeros(())
            for mb in micro_batches(ids.shape[0], n_micro):
                tok, m = token_losses(model, ids[mb], mask[mb])
                loss = normalise_loss(tok, m, per_token=per_token, global_tokens=global_tokens,
                                      global_samples=ROWS, dp_size=layout.dp, wrong_normalisation=wrong)
                if wrong:
                    loss = loss / n_micro
                loss.backward()
                loss_value += loss.detach()
            norm = grad_norm(params)
            # Every rank of a dp group holds the same value: the world mean is the dp mean.
            dist.all_reduce(loss_value)
            recorder.record(step, norm, float(loss_value) / world)
            clip_grads(params, 1.0, norm)
            optimizer.step()
            optimizer.zero_grad()
    except GradNormMismatch as e:
        return {"error": str(e), "checked": recorder.checked}
    return {"error": None, "checked": recorder.checked}


def _run(world, tp, n_micro, tmp, **kw):
    return run_ranks(train, world, tmp, tp, n_micro, timeout=180, **kw)


def run_layout(rank, world, tp, n_micro, base):
    """All modes of one layout in one group (the model is rebuilt for each)."""
    out = {}
    for mode, per_token in MODES.items():
        out[mode] = train(rank, world, tp, n_micro, per_token=per_token, wrong=False,
                          save_dir=None, load_dir=f"{base}/{mode}")
    out["wrong"] = train(rank, world, tp, n_micro, per_token=True, wrong=True,
                         save_dir=None, load_dir=f"{base}/per_token")
    return out


def record_reference(rank, world, base):
    return {mode: train(rank, world, 1, 1, per_token=per_token, wrong=False, save_dir=f"{base}/{mode}",
                        load_dir=None) for mode, per_token in MODES.items()}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    base = tmp_path_factory.mktemp("gradnorm")
    ref = run_ranks(record_reference, 1, base, str(base), timeout=180)[0]
    assert all(r["error"] is None for r in ref.values()), ref
    return base, {name: run_ranks(run_layout, world, base, tp, n_micro, str(base), timeout=180)
                  for name, (world, tp, n_micro) in LAYOUTS.items()}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_matches_reference(results, layout, mode):
    _, res = results
    for rank_out in res[layout]:
        assert rank_out[mode] == {"error": None, "checked": STEPS}


@pytest.mark.parametrize("layout", [name for name, (w, tp, mb) in LAYOUTS.items() if w // tp > 1 or mb > 1])
def test_wrong_normalisation_is_caught(results, layout):
    _, res = results
    for rank_out in res[layout]:
        err = rank_out["wrong"]["error"]
        assert err is not None and err.startswith("step 0: grad norm"), rank_out["wrong"]


def test_wrong_normalisation_is_harmless_without_split(results):
    # TP2 keeps the whole batch in one chunk: the "wrong" mean equals the right one there,
    # which shows the check compares what layouts change, not noise.
    _, res = results
    assert [r["wrong"] for r in res["tp2"]] == [{"error": None, "checked": STEPS}] * 2


def test_reference_file_has_every_step(results):
    from slime.backends.fsdp.grad_norm import read_records

    base, _ = results
    recs = read_records(base / "per_token")
    assert sorted(recs) == list(range(STEPS))
    assert all(r.grad_norm > 0 and r.loss > 0 for r in recs.values())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", *sys.argv[1:]]))
