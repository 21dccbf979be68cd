"""The engine's sampler: KV-cache decoding against full forward passes, stops, lengths, seeds, top-p.

The model is the tiny Qwen2 built locally (random weights: varied distributions, every token
likely enough to be drawn); everything runs on CPU in fp32.
"""

import sys

import pytest
import torch

from slime.backends.engine.sampler import (
    SamplingParams,
    _adjust,
    _draw,
    _draw_plain,
    _filter_logits,
    _plain,
    generate,
    left_pad,
)
from slime.model.tiny import build_tiny_model

NUM_GPUS = 0

PAD, EOS = 0, 2


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


PROMPTS = [[1, 7, 14, 8, 16], [1, 13, 15], [1, 5, 6, 14, 7, 9, 16], [1]]


def _run(model, prompts, params, seeds):
    return generate(model, prompts, params, eos_token_id=EOS, pad_token_id=PAD, seeds=seeds)


@torch.no_grad()
def _full_logprobs(model, prompt, output):
    ids = torch.tensor([list(prompt) + list(output)])
    logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(output)], logp


def test_logprobs_match_a_full_forward_of_prompt_plus_output(model):
    params = [SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True)] * len(PROMPTS)
    gens = _run(model, PROMPTS, params, seeds=[11, 12, 13, 14])
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        assert len(gen.output_ids) == 12
        reference, _ = _full_logprobs(model, prompt, gen.output_ids)
        worst = max(abs(a - b) for a, b in zip(reference, gen.logprobs, strict=True))
        assert worst <= 1e-4, (prompt, worst)
        assert all(lp <= 0 for lp in gen.logprobs)


def test_greedy_kv_cache_decoding_equals_step_by_step_full_forward(model):
    params = [SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)] * len(PROMPTS)
    gens = _run(model, PROMPTS, params, seeds=[0] * len(PROMPTS))
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(10):
                seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
        assert list(gen.output_ids) == seq[len(prompt):]


def test_left_padded_batch_gives_each_row_what_it_gets_alone(model):
    params = [SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True)] * len(PROMPTS)
    batch = _run(model, PROMPTS, params, seeds=[5, 6, 7, 8])
    for i, prompt in enumerate(PROMPTS):
        alone = _run(model, [prompt], [params[i]], seeds=[5 + i])[0]
        assert alone.output_ids == batch[i].output_ids
        assert max(abs(a - b) for a, b in zip(alone.logprobs, batch[i].logprobs, strict=True)) <= 1e-5


def test_left_pad_layout():
    ids, mask = left_pad([[4, 5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[4, 5, 6], [0, 0, 7]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_same_seed_same_tokens_other_seed_other_tokens(model):
    params = [SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True)] * 2
    a = _run(model, PROMPTS[:2], params, seeds=[3, 4])
    b = _run(model, PROMPTS[:2], params, seeds=[3, 4])
    c = _run(model, PROMPTS[:2], params, seeds=[30, 40])
    assert [g.output_ids for g in a] == [g.output_ids for g in b]
    assert [g.output_ids for g in a] != [g.output_ids for g in c]


def test_stop_token_ends_the_row_and_is_kept(model):
    # Find a token the greedy path produces at step 3, then make it a stop token.
    greedy = _run(model, PROMPTS[:1], [SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)],
                  seeds=[0])[0]
    stop = greedy.output_ids[2]
    first = greedy.output_ids.index(stop)
    gen = _run(model, PROMPTS[:1], [SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True,
                                                   stop_token_ids=(stop,))], seeds=[0])[0]
    assert gen.output_ids == greedy.output_ids[:first + 1]
    assert gen.finish_reason == {"type": "stop", "matched": stop}
    assert len(gen.logprobs) == len(gen.output_ids)


def test_eos_stops_unless_ignored(model):
    # A bias on <eos> makes it the greedy choice at once.
    bias = torch.zeros(model.config.vocab_size)
    bias[EOS] = 100.0
    with torch.no_grad():
        model.lm_head.bias = torch.nn.Parameter(bias)
    try:
        stopped = _run(model, PROMPTS[:1], [SamplingParams(max_new_tokens=5, temperature=0.0)], seeds=[0])[0]
        ignored = _run(model, PROMPTS[:1], [SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)],
                       seeds=[0])[0]
    finally:
        model.lm_head.bias = None
    assert stopped.output_ids == (EOS,)
    assert stopped.finish_reason == {"type": "stop", "matched": EOS}
    assert ignored.output_ids == (EOS,) * 5
    assert ignored.finish_reason == {"type": "length", "length": 5}


def test_each_request_gets_its_own_max_new_tokens(model):
    lengths = [1, 4, 0, 7]
    params = [SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True) for n in lengths]
    gens = _run(model, PROMPTS, params, seeds=[1, 2, 3, 4])
    assert [len(g.output_ids) for g in gens] == lengths
    assert [g.finish_reason for g in gens] == [{"type": "length", "length": n} for n in lengths]


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = torch.isfinite(_filter_logits(logits, 1.0, 0.7, -1)).tolist()
    assert kept == [True, True, False, False]  # 0.5 < 0.7 <= 0.5 + 0.3
    assert torch.isfinite(_filter_logits(logits, 1.0, 0.5, -1)).tolist() == [True, False, False, False]
    assert torch.isfinite(_filter_logits(logits, 1.0, 1.0, -1)).all()
    assert torch.isfinite(_filter_logits(logits, 1.0, 1.0, 2)).tolist() == [True, True, False, False]


def test_sampling_never_leaves_the_nucleus_and_small_top_p_is_greedy(model):
    prompt = PROMPTS[0]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1], -1)
    order = torch.argsort(probs, descending=True).tolist()
    cum, nucleus = 0.0, set()
    for tok in order:
        nucleus.add(tok)
        cum += float(probs[tok])
        if cum >= 0.6:
            break
    draws = _run(model, [prompt] * 64, [SamplingParams(max_new_tokens=1, top_p=0.6, ignore_eos=True)] * 64,
                 seeds=list(range(64)))
    firsts = {g.output_ids[0] for g in draws}
    assert firsts <= nucleus
    assert len(nucleus) == 1 or len(firsts) > 1  # it samples, not just picks the top
    tiny = _run(model, [prompt] * 8, [SamplingParams(max_new_tokens=1, top_p=1e-6, ignore_eos=True)] * 8,
                seeds=list(range(8)))
    assert {g.output_ids[0] for g in tiny} == {order[0]}


def test_draws_follow_the_distribution(model):
    # 400 one-token draws at temperature 1: each frequent token's share within 4 sigma of its probability.
    prompt = PROMPTS[1]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1], -1)
    n = 400
    draws = _run(model, [prompt] * n, [SamplingParams(max_new_tokens=1, ignore_eos=True)] * n, seeds=list(range(n)))
    counts = torch.bincount(torch.tensor([g.output_ids[0] for g in draws]), minlength=probs.numel()).float()
    sigma = torch.sqrt(probs * (1 - probs) / n)
    assert torch.all((counts / n - probs).abs() <= 4 * sigma + 1e-3)


def test_batched_draw_of_plain_rows_is_each_rows_own_draw():
    # The batched fast path must pick, row for row, what the one-row path picks from the same
    # generator state, at every temperature (greedy included), so batching never changes a sample.
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(24, 50, generator=gen) * 3
    temps = [0.0, 1.0, 0.7, 1.3, 0.05, 4.0] * 4
    params = [SamplingParams(temperature=t) for t in temps]
    seeds = list(range(100, 124))
    fast = _draw_plain(logits, list(range(24)), params, [torch.Generator().manual_seed(s) for s in seeds])
    slow = {r: _draw(logits[r], params[r], torch.Generator().manual_seed(seeds[r])) for r in range(24)}
    assert fast == slow
    assert len(set(fast.values())) > 3  # not one token everywhere
    # A subset keeps each row's own generator: row 5 alone draws what it drew in the batch.
    assert _draw_plain(logits, [5], params, [torch.Generator().manual_seed(s) for s in seeds]) == {5: slow[5]}


def test_only_rows_that_adjust_and_filter_leave_alone_are_plain():
    stops = {2}
    assert _plain(SamplingParams(temperature=0.7), [], stops, vocab=50)
    assert _plain(SamplingParams(top_k=50, top_p=1.0), [], stops, vocab=50)  # top-k of the whole vocabulary
    for params in (SamplingParams(top_p=0.9), SamplingParams(top_k=5), SamplingParams(min_p=0.1),
                   SamplingParams(repetition_penalty=1.2), SamplingParams(frequency_penalty=0.5),
                   SamplingParams(presence_penalty=-0.5), SamplingParams(logit_bias=((3, 1.0),)),
                   SamplingParams(min_new_tokens=2)):
        assert not _plain(params, [7], stops, vocab=50), params
    # min_new_tokens masks stops only until reached.
    assert _plain(SamplingParams(min_new_tokens=1), [7], stops, vocab=50)
    row = torch.randn(50)
    assert _adjust(row, SamplingParams(), [7], stops) is row
    assert torch.equal(_filter_logits(row, 1.0, 1.0, 50), row)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
