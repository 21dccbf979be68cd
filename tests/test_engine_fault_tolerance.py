"""What `--sglang-config` and `--use-fault-tolerance` rest on, without Ray.

- Engines report a SHA-256 of the weights they serve (what proves a frozen engine unchanged)
  and how many requests they hold; `batch_delay_s` makes an engine slow on purpose.
- A rollout whose engine process is killed (SIGKILL, a real child process holding requests)
  gets a replacement from `recover` and resends: every sample comes back, equal to what an
  undisturbed engine gives for the same seeds. Without `recover` the failure is an
  `EngineUnavailable` naming the engine.
- Group overrides become engine arguments, or a one-line error; `--sglang-config` is checked
  with the rest of train.py's flags; a frozen engine that changed fails the run's invariant.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from slime import invariants as inv
from slime.backends.engine import EngineClient, EngineServer, EngineUnavailable
from slime.backends.engine.engine import named_tensors, tensors_digest
from slime.backends.engine.sglang_config import EngineSpec
from slime.model.tiny import build_tiny_model
from slime.rollout.generate import RolloutSpec, generate_groups
from slime.rollout.source import Prompt

NUM_GPUS = 0
GREEDY = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}

# A child process serving one engine; prints its URL, then serves until killed.
CHILD = """
import sys, time
from slime.backends.engine import EngineServer
srv = EngineServer(sys.argv[1], batch_delay_s=float(sys.argv[2]))
print(srv.start(), flush=True)
while True:
    time.sleep(60)
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "a", seed=0)


@pytest.fixture(scope="module")
def tokenizer(model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model))


def _checkpoint_digest(path) -> str:
    from transformers import AutoModelForCausalLM

    return tensors_digest(named_tensors(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)))


def test_weights_digest_is_the_checkpoint_s_and_follows_refit_and_sleep(model, tmp_path):
    other = build_tiny_model(tmp_path / "b", seed=1)
    with EngineServer(model, weights_dirs=[tmp_path]) as srv:
        c = EngineClient(srv.url, timeout=60)
        start = c.server_info()["weights_digest"]
        assert start == _checkpoint_digest(model)
        c.release_memory_occupation()
        assert c.server_info()["weights_digest"] is None  # nothing is served while released
        c.resume_memory_occupation()
        assert c.server_info()["weights_digest"] == start
        c.update_weights_from_disk(str(other), weight_version="1")
        assert c.server_info()["weights_digest"] == _checkpoint_digest(other) != start


def test_a_slow_engine_reports_requests_in_flight(model):
    with EngineServer(model, batch_delay_s=1.0) as srv:
        c = EngineClient(srv.url, timeout=60)
        assert c.server_info()["requests_in_flight"] == 0
        assert c.server_info()["batch_delay_s"] == 1.0
        done = threading.Thread(target=c.generate, args=([[1, 7, 14, 8, 16]] * 3, [GREEDY] * 3))
        started = time.monotonic()
        done.start()
        seen = 0
        while done.is_alive() and not seen:
            seen = c.server_info()["requests_in_flight"]  # answered while the batch waits
            time.sleep(0.02)
        done.join()
        assert seen == 3, f"saw {seen} requests in flight"
        assert time.monotonic() - started >= 1.0
        assert c.server_info()["requests_in_flight"] == 0


def _prompts() -> list[Prompt]:
    return [Prompt(index=i, text=f"{a}+{b}=", label=str(a + b)) for i, (a, b) in enumerate([(1, 2), (3, 4), (2, 2)])]


SPEC = RolloutSpec(n_samples_per_prompt=2, max_new_tokens=4, seed=5)


def test_a_killed_engine_is_replaced_and_its_requests_resent(model, tokenizer):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(model), "2.0"], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        url = child.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        doomed = EngineClient(url, timeout=60)
        doomed.wait_healthy(timeout=60)
        killed = threading.Event()

        def kill_when_busy() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if doomed.server_info()["requests_in_flight"] > 0:
                    os.kill(child.pid, signal.SIGKILL)
                    killed.set()
                    return
                time.sleep(0.02)

        with EngineServer(model) as spare, EngineServer(model) as reference:
            calls = []

            def recover(client, *, requests):
                calls.append((client.url, requests))
                return EngineClient(spare.url, timeout=60)

            killer = threading.Thread(target=kill_when_busy)
            killer.start()
            groups, version = generate_groups([doomed], tokenizer, _prompts(), SPEC, rollout_id=3, recover=recover)
            killer.join()
            assert killed.is_set(), "the engine never held requests, so it was not killed mid-rollout"
            assert child.wait(timeout=10) == -signal.SIGKILL
            assert calls == [(url, 6)]
            assert version == "0"
            assert [len(g) for g in groups] == [2, 2, 2]
            assert sorted(s.index for g in groups for s in g) == list(range(6))
            # Per-sequence seeds: the resent requests give what an undisturbed engine gives.
            clean, _ = generate_groups([EngineClient(reference.url)], tokenizer, _prompts(), SPEC, rollout_id=3)
            assert [[s.tokens for s in g] for g in groups] == [[s.tokens for s in g] for g in clean]
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        child.stdout.close()


def test_without_recovery_a_dead_engine_fails_the_rollout_naming_it(model, tokenizer):
    srv = EngineServer(model)
    url = srv.start()
    srv.stop()
    with pytest.raises(EngineUnavailable, match=url.replace(".", r"\.")):
        generate_groups([EngineClient(url, timeout=10)], tokenizer, _prompts(), SPEC, rollout_id=0)


def test_recovery_gives_up_after_the_retries(model, tokenizer):
    srv = EngineServer(model)
    url = srv.start()
    srv.stop()
    calls = []

    def recover(client, *, requests):
        calls.append(requests)
        return client  # "restarted" but still dead

    with pytest.raises(EngineUnavailable):
        generate_groups([EngineClient(url, timeout=10)], tokenizer, _prompts(), SPEC, rollout_id=0,
                        recover=recover)
    assert len(calls) == 2


def _spec(**overrides) -> EngineSpec:
    return EngineSpec(name="actor-g0-e0", model="actor", model_path=None, worker_type="regular", gpus=(0,),
                      update_weights=True, offload=False, overrides=tuple(sorted(overrides.items())))


def test_group_overrides_become_engine_arguments_or_one_line_errors():
    from slime.ray.engines import EngineConfigError, actor_kwargs, default_specs

    assert actor_kwargs(_spec(max_batch_size=8, batch_delay_s=1), "slime") == {"batch_delay_s": 1.0,
                                                                              "max_batch_size": 8}
    with pytest.raises(EngineConfigError, match=r"overrides\.mem_fraction_static is not an argument .* "
                                                r"batch_delay_s, max_batch_size"):
        actor_kwargs(_spec(mem_fraction_static=0.8), "slime")
    with pytest.raises(EngineConfigError, match=r"overrides\.max_batch_size must be a number >= 0"):
        actor_kwargs(_spec(max_batch_size=-1), "slime")
    # A real SGLang server takes them as its own command-line flags.
    assert actor_kwargs(_spec(mem_fraction_static=0.8, enable_memory_saver=True, log_requests=False),
                        "sglang") == {"extra_args": ("--enable-memory-saver", "--mem-fraction-static", "0.8")}
    specs = default_specs(3, offload=True)
    assert [s.name for s in specs] == ["actor-g0-e0", "actor-g0-e1", "actor-g0-e2"]
    assert [s.gpus for s in specs] == [(0,), (1,), (2,)] and all(s.offload and s.update_weights for s in specs)


def test_train_flags_check_the_sglang_config(tmp_path, model):
    from slime.utils.arguments import ArgumentsError, build_parser, check_training_path

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "1+2=", "label": "3"}\n')
    base = ["--hf-checkpoint", str(model), "--prompt-data", str(prompts), "--num-rollout", "1",
            "--num-gpus", "4", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2"]

    def _parse(argv):
        return check_training_path(build_parser().parse_args([*base, *argv]), {})

    good = tmp_path / "good.yaml"
    good.write_text("sglang:\n  - name: actor\n    engine_groups:\n      - num_gpus: 2\n"
                    "      - worker_type: placeholder\n        num_gpus: 1\n")
    args = _parse(["--rollout-num-gpus", "3", "--sglang-config", str(good)])
    assert [e.name for e in args.sglang_layout.engines()] == ["actor-g0-e0", "actor-g0-e1"]
    assert args.sglang_layout.num_gpus == 3
    with pytest.raises(ArgumentsError, match=r"--sglang-config .*good\.yaml: sglang: the groups take 3 GPUs "
                                             r"but the rollout has 2"):
        _parse(["--rollout-num-gpus", "2", "--sglang-config", str(good)])
    # Colocated, the rollout has every GPU, and groups offload unless they say otherwise.
    four = tmp_path / "four.yaml"
    four.write_text("sglang:\n  - name: actor\n    engine_groups:\n      - num_gpus: 3\n"
                    "  - name: ref\n    update_weights: false\n    offload: false\n"
                    "    engine_groups:\n      - num_gpus: 1\n")
    layout = _parse(["--colocate", "--sglang-config", str(four)]).sglang_layout
    assert [(e.name, e.offload, e.update_weights) for e in layout.engines()] == [
        ("actor-g0-e0", True, True), ("actor-g0-e1", True, True), ("actor-g0-e2", True, True),
        ("ref-g0-e0", False, False)]
    with pytest.raises(ArgumentsError, match="cannot read the file"):
        _parse(["--rollout-num-gpus", "3", "--sglang-config", str(tmp_path / "missing.yaml")])
    with pytest.raises(ArgumentsError, match="--rollout-num-gpus-per-engine > 1 needs --sglang-config"):
        _parse(["--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine", "2"])


def test_a_frozen_engine_that_changed_fails_the_invariant():
    states = [{"name": "actor-g0-e0", "update_weights": True, "weight_version": "3", "weights_digest": "b"},
              {"name": "ref-g0-e0", "update_weights": False, "weight_version": "0", "weights_digest": "a"}]
    inv.check_frozen_engines(states, {"ref-g0-e0": "a"}, step=2)
    with pytest.raises(inv.InvariantViolation, match="frozen engine ref-g0-e0's weights changed"):
        inv.check_frozen_engines(states, {"ref-g0-e0": "c"}, step=2)
    states[1]["weight_version"] = "3"
    with pytest.raises(inv.InvariantViolation, match="reports weight version 3; it must never be refit"):
        inv.check_frozen_engines(states, {"ref-g0-e0": "a"}, step=2)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
