"""The engine speaks SGLang's `/generate` as slime's own code calls it.

The payloads below are the dicts slime's rollout (`slime/rollout/sglang_rollout.py`:
`GenerateState.sampling_params`, `generate`), its evaluation (`eval_rollout_single_dataset`),
its streaming rollout (`sglang_streaming_rollout.py`) and its on-policy distillation
(`on_policy_distillation.reward_func`) build, written out as data with the values slime's
defaults give them. Each is posted unchanged over loopback HTTP to a real engine serving the
tiny Qwen2 built locally, and the answer is read the way slime's code reads it. Then one
test per implemented sampling parameter, each failing if the engine ignored it, and the
accepted-without-effect and refused lists docs/framework/engine.md gives.
"""

import json
import math
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from slime.backends.engine import EngineServer
from slime.backends.engine.api import ACCEPTED, IMPLEMENTED, REFUSED, TOP_REFUSED
from slime.backends.engine.sampler import SamplingParams, _adjust
from slime.model.tiny import build_tiny_model

NUM_GPUS = 0

PROMPT = [1, 7, 14, 8, 16]  # <bos> 3 + 4 =

# GenerateState.sampling_params with slime's argument defaults (rollout_temperature 1.0,
# rollout_top_p 1.0, rollout_top_k -1, rollout_stop None, rollout_stop_token_ids None,
# rollout_skip_special_tokens False); generate() then subtracts the response length so far.
ROLLOUT_SAMPLING = {
    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 8, "stop": None,
    "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
    "spaces_between_special_tokens": False,
}
ROLLOUT = {"sampling_params": ROLLOUT_SAMPLING, "return_logprob": True, "input_ids": PROMPT}
# rollout_top_p != 1 adds custom_params; deterministic inference adds a per-sample seed.
ROLLOUT_TOP_P = {"sampling_params": {**ROLLOUT_SAMPLING, "top_p": 0.9,
                                     "custom_params": {"return_top_p_token_ids": True}},
                 "return_logprob": True, "input_ids": PROMPT}
ROLLOUT_SEEDED = {"sampling_params": {**ROLLOUT_SAMPLING, "sampling_seed": 42 + 3},
                  "return_logprob": True, "input_ids": PROMPT}
# eval_rollout_single_dataset's base_sampling_params, with a dataset config that sets
# stop, repetition_penalty and min_new_tokens, and a seed per sample (rollout_seed + j).
EVAL = {"sampling_params": {
    "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 8, "stop": ["</answer>"],
    "stop_token_ids": [2], "skip_special_tokens": True, "no_stop_trim": True,
    "spaces_between_special_tokens": False, "repetition_penalty": 1.05, "min_new_tokens": 2,
    "sampling_seed": 42 + 1}, "return_logprob": True, "input_ids": PROMPT}
# on_policy_distillation.reward_func: the teacher scores prompt + response, generating nothing.
OPD = {"input_ids": [*PROMPT, 2, 12, 8], "sampling_params": {"temperature": 1.0, "max_new_tokens": 0,
                                                             "skip_special_tokens": False},
       "return_logprob": True, "logprob_start_len": 0}
# sglang_streaming_rollout.generate: the rollout's payload with "stream": True.
STREAM = {"sampling_params": ROLLOUT_SAMPLING, "return_logprob": True, "stream": True, "input_ids": PROMPT}
GREEDY = {"max_new_tokens": 10, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "model", seed=0)


@pytest.fixture(scope="module")
def server(model):
    with EngineServer(model, seed=0) as srv:
        yield srv


def _call(srv, path, body=None, method=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path, data=data, method=method or ("POST" if data else "GET"),
                                 headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=120) as resp:
            raw = resp.read()
            kind = resp.headers.get("Content-Type", "")
            return resp.status, raw.decode() if kind.startswith("text/event-stream") else json.loads(raw or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _gen(srv, body):
    status, out = _call(srv, "/generate", body)
    assert status == 200, out
    return out


def _read_like_slime(output):
    """What sglang_rollout.generate and Sample.append_response_tokens take from an answer."""
    meta = output["meta_info"]
    tokens = [item[1] for item in meta["output_token_logprobs"]]
    log_probs = [item[0] for item in meta["output_token_logprobs"]]
    status = {"length": "TRUNCATED", "abort": "ABORTED", "stop": "COMPLETED"}[meta["finish_reason"]["type"]]
    return tokens, log_probs, output["text"], status, meta["weight_version"]


@pytest.mark.parametrize("payload", [ROLLOUT, ROLLOUT_TOP_P, ROLLOUT_SEEDED, EVAL], ids=[
    "rollout", "rollout-top-p", "rollout-seeded", "eval"])
def test_slime_payloads_sent_unchanged_get_answers_slime_parses(server, payload):
    out = _gen(server, payload)
    tokens, log_probs, text, status, version = _read_like_slime(out)
    assert tokens == out["output_ids"] and 1 <= len(tokens) <= 8
    assert all(math.isfinite(lp) and lp <= 0 for lp in log_probs)
    assert isinstance(text, str) and version == "0"
    assert status in ("TRUNCATED", "COMPLETED")
    assert out["meta_info"]["cached_tokens"] == 0  # Sample.prefix_cache_info reads it


def test_a_seeded_rollout_payload_is_reproducible(server):
    assert _gen(server, ROLLOUT_SEEDED)["output_ids"] == _gen(server, ROLLOUT_SEEDED)["output_ids"]


def test_on_policy_distillation_reads_the_teacher_s_prompt_log_probs(server, model):
    out = _gen(server, OPD)
    entries = out["meta_info"]["input_token_logprobs"]
    assert out["output_ids"] == [] and [e[1] for e in entries] == OPD["input_ids"]
    assert entries[0][0] is None  # the first token has no log-prob; slime drops it with [1:]
    teacher = torch.tensor([item[0] for item in entries[1:]], dtype=torch.float32)
    # The same numbers from a full forward pass of the served model.
    from transformers import AutoModelForCausalLM

    ref_model = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    ids = torch.tensor([OPD["input_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(ref_model(ids).logits[0, :-1].float(), dim=-1)
    expected = logp.gather(1, ids[0, 1:, None])[:, 0]
    assert torch.allclose(teacher, expected, atol=1e-5), (teacher, expected)
    # logprob_start_len = k starts the list at token k.
    later = _gen(server, {**OPD, "logprob_start_len": 3})["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in later] == OPD["input_ids"][3:] and later[0][0] == pytest.approx(float(expected[2]))


def test_the_streaming_rollout_reads_server_sent_events(server):
    raw = _gen(server, STREAM)
    events = [line[len("data:"):].strip() for line in raw.splitlines() if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    assert [i[1] for i in last["meta_info"]["output_token_logprobs"]] == last["output_ids"]
    seeded = {**STREAM, "sampling_params": {**ROLLOUT_SAMPLING, "sampling_seed": 9}}
    plain = {**seeded}
    plain.pop("stream")
    streamed = json.loads(_gen(server, seeded).splitlines()[0][len("data:"):])
    assert streamed["output_ids"] == _gen(server, plain)["output_ids"]


def test_multimodal_rollout_payload_is_a_400_naming_the_feature(server):
    body = {"sampling_params": ROLLOUT_SAMPLING, "return_logprob": True, "text": "3+4=",
            "image_data": ["data:image/png;base64,AAAA"]}
    status, out = _call(server, "/generate", body)
    assert status == 400 and "multimodal input (image_data)" in out["message"]


# ---- one test per implemented parameter ---------------------------------------------------
def _ids(server, **params):
    return _gen(server, {"input_ids": PROMPT, "sampling_params": {**GREEDY, **params}})["output_ids"]


def test_stop_strings_end_the_output_and_are_trimmed_unless_no_stop_trim(server):
    base = _gen(server, {"input_ids": PROMPT, "sampling_params": GREEDY})
    stop = server.engine.decode(base["output_ids"][2:4], False)  # what tokens 3 and 4 spell
    trimmed = _gen(server, {"input_ids": PROMPT, "sampling_params": {**GREEDY, "stop": [stop]}})
    assert trimmed["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert trimmed["output_ids"] == base["output_ids"][:4]
    assert trimmed["text"] == server.engine.decode(base["output_ids"][:2], True)
    kept = _gen(server, {"input_ids": PROMPT, "sampling_params": {**GREEDY, "stop": stop, "no_stop_trim": True}})
    assert kept["text"].endswith(stop) and kept["output_ids"] == trimmed["output_ids"]


def test_stop_token_ids_end_the_output(server):
    base = _ids(server)
    assert _ids(server, stop_token_ids=[base[2]]) == base[:3]


def test_min_new_tokens_holds_back_stop_tokens(server):
    base = _ids(server)
    stop = base[0]
    assert _ids(server, stop_token_ids=[stop]) == [stop]
    held = _ids(server, stop_token_ids=[stop], min_new_tokens=3)
    assert len(held) >= 3 and stop not in held[:3]


def test_repetition_penalty_changes_the_greedy_path(server):
    base = _ids(server)
    assert _ids(server, repetition_penalty=0.5) != base  # < 1 rewards repeats


def test_repetition_penalty_is_ctrl_s_formula():
    logits = torch.tensor([2.0, -1.0, 0.5])
    out = _adjust(logits, SamplingParams(repetition_penalty=2.0), [0, 1, 1], set())
    assert out.tolist() == [1.0, -2.0, 0.5]  # positive divided, negative multiplied, unseen kept


@pytest.mark.parametrize("key", ["frequency_penalty", "presence_penalty"])
def test_frequency_and_presence_penalties_break_repetition(server, key):
    base = _ids(server, max_new_tokens=12)
    penalised = _ids(server, max_new_tokens=12, **{key: 2.0})
    assert penalised != base
    assert max(penalised.count(t) for t in set(penalised)) < max(base.count(t) for t in set(base))


def test_frequency_penalty_counts_and_presence_penalty_does_not():
    logits = torch.zeros(4)
    freq = _adjust(logits, SamplingParams(frequency_penalty=0.5), [1, 1, 2], set())
    pres = _adjust(logits, SamplingParams(presence_penalty=0.5), [1, 1, 2], set())
    assert freq.tolist() == [0.0, -1.0, -0.5, 0.0] and pres.tolist() == [0.0, -0.5, -0.5, 0.0]


def test_min_p_keeps_only_tokens_near_the_most_likely(server):
    temp, min_p = 5.0, 0.9
    body = {"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": 1,
            "sampling_params": {"max_new_tokens": 40, "temperature": temp, "ignore_eos": True, "sampling_seed": 3}}

    def margins(extra):
        meta = _gen(server, {**body, "sampling_params": {**body["sampling_params"], **extra}})["meta_info"]
        # Log-probs are of the temperature-1 distribution: p_T(tok) / max p_T = exp(margin / T).
        return [(lp - top[0][0]) / temp for (lp, _, _), top in zip(meta["output_token_logprobs"],
                                                                  meta["output_top_logprobs"], strict=True)]
    assert min(margins({})) < math.log(min_p) - 1e-6  # without min_p, far-off tokens are drawn
    assert min(margins({"min_p": min_p})) >= math.log(min_p) - 1e-5


def test_n_samples_each_prompt_n_times(server):
    out = _gen(server, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "n": 3,
                                                                 "ignore_eos": True}})
    assert isinstance(out, list) and len(out) == 3
    assert len({tuple(o["output_ids"]) for o in out}) > 1
    batch = _gen(server, {"input_ids": [PROMPT, PROMPT[:3]], "sampling_params": {**GREEDY, "n": 2}})
    assert len(batch) == 4 and batch[0]["output_ids"] == batch[1]["output_ids"]  # greedy: n equal copies
    assert batch[2]["meta_info"]["prompt_tokens"] == 3


def test_n_samples_with_a_seed_draw_with_consecutive_seeds(server):
    sp = {"max_new_tokens": 8, "ignore_eos": True}
    out = _gen(server, {"input_ids": PROMPT, "sampling_params": {**sp, "n": 3, "sampling_seed": 40}})
    alone = [_gen(server, {"input_ids": PROMPT, "sampling_params": {**sp, "sampling_seed": s}})["output_ids"]
             for s in (40, 41, 42)]
    assert [o["output_ids"] for o in out] == alone
    assert len({tuple(ids) for ids in alone}) > 1


def test_logit_bias_moves_greedy_to_the_biased_token(server):
    assert _ids(server, logit_bias={"5": 100.0}) == [5] * 10


def test_ignore_eos_runs_past_eos(server):
    eos = server.engine.eos_token_id
    stopped = _ids(server, ignore_eos=False, logit_bias={str(eos): 100.0})
    assert stopped == [eos]
    assert len(_ids(server, logit_bias={str(eos): 100.0})) == 10


def test_top_logprobs_and_text_in_logprobs(server):
    out = _gen(server, {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True,
                        "top_logprobs_num": 3, "return_text_in_logprobs": True, "rid": "q-1"})
    meta = out["meta_info"]
    assert meta["id"] == "q-1"
    for (lp, tok, text), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True):
        assert text == server.engine.decode([tok], False)
        assert len(top) == 3 and [t[0] for t in top] == sorted((t[0] for t in top), reverse=True)
        assert top[0][1] == tok and top[0][0] == pytest.approx(lp)  # greedy picks the top one


def test_skip_special_tokens_keeps_or_drops_special_text(server):
    eos = server.engine.eos_token_id
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0,
                                                     "logit_bias": {str(eos): 100.0}, "no_stop_trim": True}}
    kept = _gen(server, {**body, "sampling_params": {**body["sampling_params"], "skip_special_tokens": False}})
    dropped = _gen(server, body)
    assert kept["text"] == server.engine.decode([eos], False) != "" and dropped["text"] == ""


def test_accepted_parameters_change_nothing(server):
    base = _gen(server, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "sampling_seed": 4}})
    extra = {"spaces_between_special_tokens": False, "custom_params": {"return_top_p_token_ids": True},
             "stream_interval": 4}
    assert set(extra) == set(ACCEPTED)
    same = _gen(server, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "sampling_seed": 4,
                                                                   **extra}, "log_metrics": True, "priority": 1})
    assert same["output_ids"] == base["output_ids"] and same["text"] == base["text"]


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_refused_sampling_parameters_name_the_feature(server, key):
    status, out = _call(server, "/generate", {"input_ids": PROMPT, "sampling_params": {key: "x"}})
    assert status == 400 and REFUSED[key] in out["message"]


@pytest.mark.parametrize("key", sorted(TOP_REFUSED))
def test_refused_request_fields_name_the_feature(server, key):
    status, out = _call(server, "/generate", {"input_ids": PROMPT, key: ["x"]})
    assert status == 400 and TOP_REFUSED[key] in out["message"]


def test_every_documented_parameter_is_in_exactly_one_list():
    documented = {  # SGLang's SamplingParams API fields
        "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
        "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
        "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
        "spaces_between_special_tokens", "no_stop_trim", "custom_params", "stream_interval", "logit_bias",
        "sampling_seed"}
    lists = [set(IMPLEMENTED), set(ACCEPTED), set(REFUSED)]
    assert set().union(*lists) == documented and sum(map(len, lists)) == len(documented)
    page = (Path(__file__).resolve().parents[1] / "docs" / "framework" / "engine.md").read_text()
    for key in documented:
        assert f"`{key}`" in page, key


def test_v1_models_lists_the_served_model(server, model):
    status, out = _call(server, "/v1/models")
    assert status == 200 and out["object"] == "list" and out["data"][0]["id"] == str(model)



def test_the_clients_wire_model_is_the_servers():
    # What a client builds with `wire` is what the server parses back, field for field, and
    # what the server answers is what a client reads back: the one model on both sides.
    from slime.backends.engine.api import build_response, parse_generate
    from slime.backends.engine.sampler import Generation
    from slime.backends.engine.wire import GenerateInput, parse_output, request_body

    every = SamplingParams(max_new_tokens=9, temperature=0.5, top_p=0.9, top_k=4, min_p=0.1,
                           stop_token_ids=(3,), stop=("x",), min_new_tokens=1, repetition_penalty=1.5,
                           frequency_penalty=0.5, presence_penalty=-0.5, logit_bias=((5, 2.0),),
                           ignore_eos=True, seed=7, n=2, skip_special_tokens=False, no_stop_trim=True)
    inputs = [GenerateInput(input_ids=tuple(PROMPT), params=every, logprob_start_len=1, top_logprobs_num=2,
                            rid="a"),
              GenerateInput(input_ids=(1, 2), params=SamplingParams(max_new_tokens=3), return_logprob=False)]
    body = json.loads(json.dumps(request_body(inputs)))
    parsed, batched = parse_generate(body, tokenize=lambda text: [])
    assert batched and parsed == inputs
    single = request_body(inputs[:1])
    assert single["input_ids"] == PROMPT and single["sampling_params"]["sampling_seed"] == 7
    gen = Generation(output_ids=(4, 3), logprobs=(-0.5, -0.25), finish_reason={"type": "stop", "matched": 3},
                     output_top=(((-0.5, 4), (-1.0, 6)), ((-0.25, 3), (-2.0, 4))),
                     input_logprobs=(-1.5, -2.5, -3.5, -4.5), input_top=(((-1.5, 7), (-2.0, 1)),) * 4)
    answer = build_response(parsed[0], gen, weight_version="3", latency_s=0.01, decode=lambda ids, skip: "t")
    assert parse_output(json.loads(json.dumps(answer.to_json()))) == answer
    assert answer.logprobs == (-0.5, -0.25) and answer.finish_kind == "stop" and answer.matched_stop == 3


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
