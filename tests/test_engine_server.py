"""The engine's HTTP API over real loopback HTTP: every endpoint, 400s for bad input, refit, sleep/wake.

Servers are real `EngineServer`s (a thread of this process, bound to 127.0.0.1 on a free port)
serving the tiny Qwen2 built locally; the client is `EngineClient` (urllib), as the trainer uses.
"""

import json
import socket
import sys
import threading
import time
import urllib.request

import pytest
import torch

from slime.backends.engine import (
    EngineClient,
    EngineRequestError,
    EngineRouter,
    EngineServer,
    EngineUnavailable,
)
from slime.backends.engine.weights import serialize_named_tensors
from slime.model.tiny import build_tiny_model

NUM_GPUS = 0

PROMPT = [1, 7, 14, 8, 16]  # "<bos>3+4="
SAMPLE = {"max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True, "sampling_seed": 7}
GREEDY = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"a": build_tiny_model(root / "a", seed=0), "b": build_tiny_model(root / "b", seed=1),
            "wide": build_tiny_model(root / "wide", seed=0, hidden_size=96, intermediate_size=128)}


@pytest.fixture(scope="module")
def shared_server(models):
    """For tests that change nothing (rejected requests must not)."""
    with EngineServer(models["a"], weights_dirs=[models["a"].parent], seed=0) as srv:
        yield srv


@pytest.fixture
def server(models):
    with EngineServer(models["a"], weights_dirs=[models["a"].parent], seed=0) as srv:
        yield srv


@pytest.fixture
def client(server):
    return EngineClient(server.url, timeout=60)


def _raw(url, method, path, data=None):
    """(status, parsed body) without the client, so malformed bodies reach the server as sent."""
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=60) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_generate_answers_with_sglang_fields(client):
    out = client.generate(PROMPT, SAMPLE, return_logprob=True, rid="r1")
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["id"] == "r1"
    assert meta["prompt_tokens"] == len(PROMPT)
    assert meta["completion_tokens"] == len(out["output_ids"]) == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["weight_version"] == "0"
    logprobs = meta["output_token_logprobs"]
    assert [entry[1] for entry in logprobs] == out["output_ids"]
    assert all(isinstance(lp, float) and lp <= 0 and text is None for lp, _, text in logprobs)
    info = client.model_info()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(info["model_path"])
    assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=True)
    without = client.generate(PROMPT, SAMPLE, return_logprob=False)
    assert "output_token_logprobs" not in without["meta_info"]
    assert without["output_ids"] == out["output_ids"]  # same sampling_seed, same tokens


def test_batch_text_and_per_prompt_params(client):
    outs = client.generate([PROMPT, PROMPT[:3]], [dict(GREEDY, max_new_tokens=2), dict(GREEDY, max_new_tokens=5)])
    assert isinstance(outs, list) and [len(o["output_ids"]) for o in outs] == [2, 5]
    by_text = client.request("POST", "/generate", {"text": "3+4=", "sampling_params": GREEDY,
                                                   "return_logprob": True, "return_text_in_logprobs": True})
    by_ids = client.generate(PROMPT, GREEDY)
    assert by_text["output_ids"] == by_ids["output_ids"]
    assert all(isinstance(t, str) for _, _, t in by_text["meta_info"]["output_token_logprobs"])


def test_http_logprobs_match_a_full_forward(client, models):
    from transformers import AutoModelForCausalLM

    out = client.generate(PROMPT, SAMPLE)
    model = AutoModelForCausalLM.from_pretrained(models["a"], dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([PROMPT + out["output_ids"]])).logits[0], -1)
    for i, (lp, tok, _) in enumerate(out["meta_info"]["output_token_logprobs"]):
        assert abs(lp - float(logp[len(PROMPT) - 1 + i, tok])) <= 1e-4


def test_engine_seed_makes_unseeded_requests_reproducible(models):
    runs = []
    for _ in range(2):
        with EngineServer(models["a"], weights_dirs=[models["a"].parent], seed=3) as srv:
            c = EngineClient(srv.url)
            runs.append([c.generate(PROMPT, {"max_new_tokens": 8, "ignore_eos": True})["output_ids"]
                         for _ in range(3)])
    assert runs[0] == runs[1]
    assert len({tuple(x) for x in runs[0]}) > 1  # successive requests draw different seeds


BAD_GENERATE = [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "JSON object"),
    ({}, "exactly one of input_ids and text"),
    ({"input_ids": PROMPT, "text": "1+1="}, "exactly one of input_ids and text"),
    ({"input_ids": []}, "non-empty"),
    ({"input_ids": [1, "x"]}, "integers"),
    ({"input_ids": [1, 99]}, "outside the vocabulary"),
    ({"input_ids": PROMPT, "sampling_params": {"temperature": -1}}, "temperature"),
    ({"input_ids": PROMPT, "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": PROMPT, "sampling_params": {"top_k": 0}}, "top_k"),
    ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": -2}}, "max_new_tokens"),
    ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 500}}, "positions"),
    ({"input_ids": PROMPT, "sampling_params": {"stop_token_ids": [500]}}, "stop_token_ids"),
    ({"input_ids": PROMPT, "sampling_params": {"banana": 1.0}}, "unsupported keys"),
    ({"input_ids": PROMPT, "sampling_params": {"sampling_seed": -1}}, "sampling_seed"),
    ({"input_ids": PROMPT, "sampling_params": "hot"}, "must be an object"),
    ({"input_ids": PROMPT, "stream": "yes"}, "stream"),
    ({"input_ids": PROMPT, "banana": 1}, "unsupported keys"),
    ({"input_ids": [PROMPT, PROMPT], "sampling_params": [GREEDY]}, "1 entries for 2 prompts"),
    ({"input_ids": PROMPT, "return_logprob": "yes"}, "true or false"),
]


@pytest.mark.parametrize(("body", "needle"), BAD_GENERATE)
def test_bad_generate_requests_are_400_with_a_message(shared_server, body, needle):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, answer = _raw(shared_server.url, "POST", "/generate", data)
    assert status == 400
    assert needle in answer["message"] and answer["success"] is False
    assert answer["error"]["message"] == answer["message"]


def test_bad_control_requests_are_400_with_a_message(client, models, tmp_path):
    cases = [
        ("/update_weights_from_disk", {}, "model_path is required"),
        ("/update_weights_from_disk", {"model_path": str(tmp_path / "nope")}, "not a model directory"),
        ("/update_weights_from_disk", {"model_path": str(models["wide"])}, "shape"),
        ("/update_weights_from_disk", {"model_path": str(models["b"]), "load_format": "gguf"}, "load_format"),
        ("/update_weights_from_tensor", {}, "serialized_named_tensors is required"),
        ("/update_weights_from_tensor", {"serialized_named_tensors": ["%%%"]}, "base64"),
        ("/update_weights_from_tensor",
         {"serialized_named_tensors": [serialize_named_tensors({"nope.weight": torch.zeros(2)})]},
         "unknown parameter names: nope.weight"),
        ("/update_weights_from_tensor",
         {"serialized_named_tensors": [serialize_named_tensors({"lm_head.weight": torch.zeros(2, 2)})]},
         "lm_head.weight: shape (2, 2)"),
        ("/update_weights_from_tensor",
         {"serialized_named_tensors": [serialize_named_tensors({"lm_head.weight": torch.zeros(17, 64)})],
          "load_format": "pickle"}, "load_format"),
        ("/release_memory_occupation", {"tags": ["gpu_everything"]}, "tags"),
        ("/update_weight_version", {}, "new_version is required"),
    ]
    before = client.generate(PROMPT, GREEDY)["output_ids"]
    for path, body, needle in cases:
        with pytest.raises(EngineRequestError) as info:
            client.request("POST", path, body)
        assert info.value.status == 400, path
        assert needle in info.value.message, (path, info.value.message)
        assert client.weight_version() == "0"
    # A rejected refit changed nothing.
    assert client.generate(PROMPT, GREEDY)["output_ids"] == before


def test_unknown_paths_and_methods(shared_server):
    status, answer = _raw(shared_server.url, "GET", "/v1/nothing")
    assert status == 404 and "/generate" in answer["message"]
    status, answer = _raw(shared_server.url, "GET", "/generate")
    assert status == 405


def test_kept_alive_connection_survives_refused_requests(shared_server):
    import http.client

    host, port = shared_server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        for path, body, status in [("/nothing", b'{"x": 1}', 404), ("/generate", b"{bad", 400),
                                   ("/get_weight_version", b'{"y": 2}', 405),
                                   ("/generate", json.dumps({"input_ids": PROMPT, "sampling_params": GREEDY}).encode(),
                                    200)]:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == status, path
    finally:
        conn.close()


def test_health_flush_and_info(client, server):
    client.health()
    assert client.is_healthy()
    assert client.request("GET", "/health_generate") is None
    assert client.flush_cache()["success"] is True
    assert client.request("GET", "/flush_cache")["success"] is True
    model = client.model_info()
    assert model["is_generation"] is True and model["vocab_size"] == 17 and model["eos_token_id"] == 2
    info = client.server_info()
    import os

    assert info["engine"] == "slime" and info["device"] == "cpu" and info["gpu_ids"] == []
    assert info["pid"] == os.getpid()  # the server is a thread of this (the engine's) process
    expected = sum(t.numel() * t.element_size() for t in server.engine.model.state_dict().values())
    assert info["model_bytes"] >= expected > 0
    assert info["memory_released"] is False


def _greedy_and_sampled(client):
    return client.generate(PROMPT, GREEDY)["output_ids"], client.generate(PROMPT, SAMPLE)["output_ids"]


def test_refit_from_disk_changes_outputs_and_version(client, models):
    before = _greedy_and_sampled(client)
    with EngineServer(models["b"], weights_dirs=[models["a"].parent], seed=0) as other:
        target = _greedy_and_sampled(EngineClient(other.url))
    assert before != target
    answer = client.update_weights_from_disk(str(models["b"]), weight_version="1")
    assert answer["success"] is True
    assert client.weight_version() == "1"
    assert _greedy_and_sampled(client) == target
    assert client.generate(PROMPT, GREEDY)["meta_info"]["weight_version"] == "1"
    # Without a version the weights change and the version stays, as in SGLang.
    client.update_weights_from_disk(str(models["a"]))
    assert client.weight_version() == "1"
    assert _greedy_and_sampled(client) == before
    client.request("POST", "/update_weight_version", {"new_version": "7"})
    assert client.weight_version() == "7"


def test_refit_from_tensors_full_and_partial(client, models):
    from safetensors.torch import load_file

    before = _greedy_and_sampled(client)
    other = load_file(str(models["b"] / "model.safetensors"))
    with EngineServer(models["b"], weights_dirs=[models["a"].parent], seed=0) as srv:
        target = _greedy_and_sampled(EngineClient(srv.url))
    client.update_weights_from_tensor(other, weight_version="2")
    assert client.weight_version() == "2"
    assert _greedy_and_sampled(client) == target
    mine = load_file(str(models["a"] / "model.safetensors"))
    client.update_weights_from_tensor({k: v for k, v in mine.items() if k != "lm_head.weight"},
                                      weight_version="3")
    mixed = _greedy_and_sampled(client)
    assert mixed not in (before, target)  # only the head is still model b's
    client.update_weights_from_tensor({"lm_head.weight": mine["lm_head.weight"]}, weight_version="4")
    assert _greedy_and_sampled(client) == before
    assert client.weight_version() == "4"


def test_release_frees_the_weights_and_resume_restores_them(client, server, models):
    before = _greedy_and_sampled(client)
    held = client.server_info()["model_bytes"]
    answer = client.release_memory_occupation()
    assert answer["model_bytes"] == 0
    info = client.server_info()
    assert info["memory_released"] is True and info["model_bytes"] == 0
    assert all(t.numel() == 0 for t in server.engine.model.parameters())
    spill = server.engine._spill_dir / "weights.safetensors"
    assert spill.stat().st_size >= held
    with pytest.raises(EngineRequestError, match="resume_memory_occupation"):
        client.generate(PROMPT, GREEDY)
    with pytest.raises(EngineRequestError, match="resume_memory_occupation"):
        client.update_weights_from_disk(str(models["b"]))
    client.release_memory_occupation()  # twice is harmless
    answer = client.resume_memory_occupation()
    assert answer["model_bytes"] == held
    assert not spill.exists()
    assert client.server_info()["memory_released"] is False
    assert _greedy_and_sampled(client) == before
    # Tags: only the KV cache (which no batch outlives) leaves the weights in place.
    assert client.release_memory_occupation(["kv_cache"])["model_bytes"] == held


def test_concurrent_requests_share_batches_and_keep_their_seeds(client, server):
    seeds = list(range(12))
    expected = {s: client.generate(PROMPT, dict(SAMPLE, sampling_seed=s))["output_ids"] for s in seeds}
    batches_before = client.server_info()["batches_run"]
    results, gate = {}, threading.Barrier(len(seeds))

    def one(seed):
        gate.wait()
        results[seed] = client.generate(PROMPT, dict(SAMPLE, sampling_seed=seed))["output_ids"]

    threads = [threading.Thread(target=one, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected
    assert client.server_info()["batches_run"] - batches_before < len(seeds)


def test_a_burst_of_connections_is_served_not_reset(client):
    # One connection per sample, all at once, as a rollout sends them (the listen backlog).
    n, failures = 96, []
    gate = threading.Barrier(n)

    def one():
        gate.wait()
        try:
            client.generate(PROMPT, dict(GREEDY, max_new_tokens=1))
        except Exception as exc:
            failures.append(exc)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_a_stopped_or_absent_engine_is_named_in_the_error(models):
    srv = EngineServer(models["a"], weights_dirs=[models["a"].parent])
    url = srv.start()
    c = EngineClient(url, timeout=10)
    c.health()
    srv.stop()
    with pytest.raises(EngineUnavailable, match=url.replace(".", r"\.")):
        c.health()
    assert not c.is_healthy()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EngineUnavailable, match=f"127.0.0.1:{port}.*is it running"):
        EngineClient(f"http://127.0.0.1:{port}").generate(PROMPT, GREEDY)


def test_router_spreads_generation_and_broadcasts_control(models):
    roots = [models["a"].parent]
    with EngineServer(models["a"], seed=0, weights_dirs=roots) as one, \
            EngineServer(models["a"], seed=1, weights_dirs=roots) as two:
        router = EngineRouter([one.url, two.url])
        router.health()
        gate = threading.Barrier(8)

        def call():
            gate.wait()
            router.generate(PROMPT, SAMPLE)

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(router.routed) == 8 and min(router.routed) >= 2
        router.update_weights_from_disk(str(models["b"]), weight_version="5")
        assert router.weight_versions() == {one.url: "5", two.url: "5"}
        assert [r["model_bytes"] for r in router.release_memory_occupation()] == [0, 0]
        assert min(r["model_bytes"] for r in router.resume_memory_occupation()) > 0
        down = two.url
        two.stop()
        with pytest.raises(EngineUnavailable, match=down.replace(".", r"\.")):
            router.weight_versions()


def _blocked(engine):
    """Hold the engine's worker thread until the returned event is set."""
    release, started = threading.Event(), threading.Event()

    def hold():
        started.set()
        release.wait(30)

    threading.Thread(target=engine.call, args=(hold,), daemon=True).start()
    assert started.wait(30)
    return release


def _queued(engine, n):
    deadline = time.monotonic() + 30
    while engine._queue.qsize() < n:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_batch_reports_the_version_it_ran_with_not_the_refit_queued_after_it(models):
    from slime.backends.engine.engine import Engine, GenerateRequest
    from slime.backends.engine.sampler import SamplingParams

    with Engine(models["a"], weight_version="0") as engine:
        release = _blocked(engine)
        result = {}
        req = GenerateRequest(input_ids=tuple(PROMPT), params=SamplingParams(max_new_tokens=2), seed=0)
        gen = threading.Thread(target=lambda: result.update(out=engine.generate([req])))
        gen.start()
        _queued(engine, 1)
        refit = threading.Thread(target=engine.set_weight_version, args=("9",))
        refit.start()
        _queued(engine, 2)
        release.set()
        gen.join(30)
        refit.join(30)
        assert result["out"][1] == "0"
        assert engine.weight_version == "9"


def test_close_finishes_queued_work_and_ends_the_worker(models):
    from slime.backends.engine.engine import Engine, GenerateRequest
    from slime.backends.engine.sampler import SamplingParams

    engine = Engine(models["a"])
    release = _blocked(engine)
    outs = []
    reqs = [GenerateRequest(input_ids=tuple(PROMPT), params=SamplingParams(max_new_tokens=2), seed=i)
            for i in range(3)]
    threads = [threading.Thread(target=lambda r=r: outs.append(engine.generate([r]))) for r in reqs]
    for t in threads:
        t.start()
    _queued(engine, 3)
    closer = threading.Thread(target=engine.close)
    closer.start()
    _queued(engine, 4)  # the stop marker sits behind the three requests
    release.set()
    closer.join(20)
    assert not closer.is_alive() and not engine._worker.is_alive()
    for t in threads:
        t.join(5)
    assert len(outs) == 3



def test_enqueued_jobs_fill_batches_up_to_the_cap_and_each_gets_its_own_answer(models):
    import concurrent.futures as cf

    from slime.backends.engine.engine import Engine, GenerateRequest
    from slime.backends.engine.sampler import SamplingParams

    with Engine(models["a"], max_batch_size=8) as engine:
        release = _blocked(engine)
        jobs = [([GenerateRequest(input_ids=tuple(PROMPT), params=SamplingParams(max_new_tokens=2), seed=10 * j + i)
                  for i in range(size)], cf.Future()) for j, size in enumerate([5, 2, 4, 3])]
        engine.enqueue(jobs)
        assert engine._queue.qsize() == 1
        assert engine.requests_in_flight == 14
        release.set()
        answers = [future.result(30) for _, future in jobs]
        assert [len(gens) for gens, _ in answers] == [5, 2, 4, 3]
        # [5, 2] then [4, 3]: neither batch over the cap of 8, no job split across two.
        assert engine.batches_run == 2 and engine.requests_served == 14
        alone = engine.generate([jobs[2][0][1]])[0][0]
        assert alone.output_ids == answers[2][0][1].output_ids  # its own seed, whatever shared the batch
        assert engine.requests_in_flight == 0


def test_requests_parsed_in_one_loop_pass_reach_the_engine_as_one_queue_item(models):
    from slime.backends.engine.engine import EngineInputError, GenerateRequest
    from slime.backends.engine.sampler import SamplingParams

    with EngineServer(models["a"], seed=0) as srv:
        engine = srv.engine
        release = _blocked(engine)
        reqs = [[GenerateRequest(input_ids=tuple(PROMPT), params=SamplingParams(max_new_tokens=2), seed=i)]
                for i in range(5)]
        futures, submitted = [], threading.Event()

        def one_pass():
            futures.extend(srv._gather.submit(r) for r in reqs)
            submitted.set()
        srv._loop.call_soon_threadsafe(one_pass)
        assert submitted.wait(10)
        _queued(engine, 1)
        time.sleep(0.2)  # had each been queued on its own, the other four would be there by now
        assert engine._queue.qsize() == 1
        before = engine.batches_run
        release.set()
        assert all(len(f.result(30)[0]) == 1 for f in futures)
        assert engine.batches_run == before + 1
        # A request the engine cannot serve is refused at once, never queued.
        with pytest.raises(EngineInputError, match="outside the vocabulary"):
            srv._gather.submit([GenerateRequest(input_ids=(10**6,), params=SamplingParams(), seed=0)])


def test_sglang_backend_command_and_its_absence_here(tmp_path):
    import importlib.util

    from slime.backends.engine import launch_sglang_server
    from slime.backends.engine.sglang_backend import sglang_argv

    argv = sglang_argv("/m", host="127.0.0.1", port=30000, extra_args=["--mem-fraction-static", "0.5"])
    assert argv[1:] == ["-m", "sglang.launch_server", "--model-path", "/m", "--host", "127.0.0.1",
                        "--port", "30000", "--mem-fraction-static", "0.5"]
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed: the GPU tier runs the real server")
    with pytest.raises(RuntimeError, match="needs the sglang package"):
        launch_sglang_server("/m", port=30000, log_path=tmp_path / "log")
    assert not (tmp_path / "log").exists()  # nothing was started


def test_rollout_backend_picks_the_engine_actor():
    import importlib.util

    from slime.backends.engine.actor import EngineActor
    from slime.backends.engine.sglang_backend import SGLangActor
    from slime.ray.engines import engine_actor_class

    assert engine_actor_class("slime") is EngineActor
    assert engine_actor_class("sglang") is SGLangActor
    with pytest.raises(ValueError, match="choose slime or sglang"):
        engine_actor_class("vllm")
    actor = SGLangActor("/m", seed=7)
    assert actor.extra_args[:2] == ("--random-seed", "7") and actor.info() == {"started": False}
    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(RuntimeError, match="needs the sglang package"):
            actor.start()
        assert actor.server is None


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
