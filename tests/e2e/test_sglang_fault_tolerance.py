"""E2E: mixed offload with fault tolerance: an engine killed mid-rollout is restarted and its
requests retried, and no sample is lost (two GPUs, colocated).

The actor group runs with `batch_delay_s` (each batch waits 1.5 s before it runs: a slow
engine, so that requests are surely in flight when the kill lands). After the first step, a
thread of this test waits until the actor engine reports requests in flight, then kills its
process with SIGKILL by the pid the engine reported. Passing means: the run finished every
rollout with every sample (`rollout/samples` = batch × samples per prompt at every step);
it counted one restart and retried the killed engine's requests; the engine now runs under a
new pid, the killed one is gone, and after the restart it serves the trainer's version (the
run's --ci-test checks that after every refit); the frozen reference engine kept its pid and
its weights.
"""

import json
import os
import signal
import sys
import threading
import time
import urllib.request

import _rl

NUM_GPUS = 2
ROLLOUTS = 3
BATCH, N = 8, 4
CONFIG = """\
sglang:
  - name: actor
    offload: true
    engine_groups:
      - num_gpus: 1
        overrides: {batch_delay_s: 1.5}
  - name: ref
    update_weights: false
    offload: false
    engine_groups:
      - num_gpus: 1
"""
KILLED: dict = {}


def _info(url: str) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/get_server_info", timeout=5) as resp:
        return json.loads(resp.read())


def kill_mid_rollout(run_dir, stop: threading.Event) -> None:
    """After step 0, SIGKILL the actor engine while it holds requests."""
    while not stop.is_set():
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file() and metrics.read_text().strip():
            break
        time.sleep(0.1)
    engine = next(e for e in _rl.engines(run_dir) if e["name"] == "actor-g0-e0")
    while not stop.is_set():
        try:
            if _info(engine["url"])["requests_in_flight"] > 0:
                os.kill(engine["pid"], signal.SIGKILL)
                KILLED.update(pid=engine["pid"], at=time.time())
                print(f"killed engine actor-g0-e0 (pid {engine['pid']}) with requests in flight", flush=True)
                return
        except OSError:
            pass
        time.sleep(0.05)


def prepare() -> None:
    _rl.prepare()


def execute():
    config = _rl.sglang_config("fault_tolerance", CONFIG)
    run_dir = _rl.U.output_dir() / "sglang_fault_tolerance"
    stop = threading.Event()
    killer = threading.Thread(target=kill_mid_rollout, args=(run_dir, stop), daemon=True)
    killer.start()
    try:
        return _rl.train("sglang_fault_tolerance", NUM_GPUS, [
            "--colocate", "--sglang-config", str(config), "--engine-start-timeout", "240",
            "--use-fault-tolerance", "--ci-test",
            "--advantage-estimator", "grpo", "--rollout-batch-size", str(BATCH),
            "--n-samples-per-prompt", str(N), "--num-rollout", str(ROLLOUTS), "--lr", "5e-4",
        ])
    finally:
        stop.set()
        killer.join(timeout=10)


def check(run_dir) -> None:
    assert "pid" in KILLED, "the test never saw the actor engine with requests in flight, so killed nothing"
    rows = _rl.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(ROLLOUTS)), [r["step"] for r in rows]
    samples = [r["rollout/samples"] for r in rows]
    assert samples == [BATCH * N] * ROLLOUTS, f"samples per rollout {samples}, expected {BATCH * N} each"
    assert rows[-1]["ft/restarts"] == 1, f"restarts counted: {rows[-1]['ft/restarts']}"
    retried = rows[-1]["ft/retried_requests"]
    assert retried >= 1, "the killed engine's requests were not retried"
    try:
        os.kill(KILLED["pid"], 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, f"the killed engine's pid {KILLED['pid']} still runs"
    now = {e["name"]: e for e in _rl.engines(run_dir)}
    actor, ref = now["actor-g0-e0"], now["ref-g0-e0"]
    assert actor["restarts"] == 1 and actor["pid"] != KILLED["pid"], (actor["restarts"], actor["pid"])
    states = {e["name"]: e for e in rows[-1]["engines"]}
    assert states["actor-g0-e0"]["pid"] == actor["pid"] and states["actor-g0-e0"]["weight_version"] == str(ROLLOUTS)
    first_ref = rows[0]["engines"]
    ref_start = next(e for e in first_ref if e["name"] == "ref-g0-e0")
    assert states["ref-g0-e0"]["pid"] == ref["pid"] == ref_start["pid"], "the reference engine was restarted"
    assert states["ref-g0-e0"]["weights_digest"] == ref_start["weights_digest"]
    print(f"fault tolerance ok: engine pid {KILLED['pid']} killed, restarted as {actor['pid']}, "
          f"{int(retried)} requests retried, {sum(samples)} samples, none lost", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
