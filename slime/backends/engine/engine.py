"""One rollout engine: a model on a device, a queue, and a worker thread that batches requests.

Every operation (generation, refit, release, resume) goes through one queue served by one
thread, so a refit never lands in the middle of a batch: it waits for the batch before it and
the generations after it see the new weights. Generation requests that are waiting together
are merged into one batch (up to `max_batch_size` sequences), as a serving engine does.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import queue
import random
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slime.backends.engine.sampler import Generation, generate
from slime.backends.engine.weights import check_named_tensors, read_checkpoint
from slime.backends.engine.wire import GenerateInput, RequestError, SamplingParams


class EngineInputError(RequestError):
    """A request the engine cannot serve as sent (HTTP 400); the message says what to change."""


@dataclass(frozen=True, kw_only=True)
class GenerateRequest:
    """One sequence to sample: prompt ids, its parameters, the seed its randomness uses, and
    which prompt log-probs (from `logprob_start_len`) and top-N alternatives it reports."""

    input_ids: tuple[int, ...]
    params: SamplingParams
    seed: int
    logprob_start_len: int = -1
    top_logprobs_num: int = 0

    @classmethod
    def of(cls, prompt: GenerateInput, seed: int) -> GenerateRequest:
        """The sequence a parsed `/generate` prompt asks for, drawing with `seed`."""
        return cls(input_ids=prompt.input_ids, params=prompt.params, seed=seed,
                   logprob_start_len=prompt.logprob_start_len, top_logprobs_num=prompt.top_logprobs_num)


Answer = tuple[list[Generation], str]  # a job's generations and the weight version that made them
Job = tuple[list[GenerateRequest], cf.Future[Answer]]  # one caller's sequences and its answer

_STOP = object()  # queued by close(): the worker ends after the work before it


def _tensor_bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer of `model`, named as the engine names them."""
    named = [(f"param:{n}", p) for n, p in model.named_parameters()]
    named += [(f"buffer:{n}", b) for n, b in model.named_buffers()]
    return named


def tensors_digest(named: Sequence[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda item: item[0]):
        data = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{data.dtype}|{tuple(data.shape)}|".encode())
        h.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return h.hexdigest()


class Engine:
    """The model, its tokenizer and the serving thread; thread-safe, used by `EngineServer`."""

    def __init__(self, model_path: str | Path, *, device: str = "cpu", seed: int = 0,
                 weight_version: str = "0", max_batch_size: int = 64,
                 gpu_ids: Sequence[int] = (), cpu_threads: int | None = 1,
                 batch_delay_s: float = 0.0) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if torch.device(device).type == "cpu" and cpu_threads is not None:
            # Process-wide: a tiny model gains nothing from intra-op threads, and engines and
            # trainer ranks sharing a few busy cores slow each other down many times over.
            torch.set_num_threads(cpu_threads)

        self.model_path = str(model_path)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # Tensors report "cuda:0", never "cuda": compare against the indexed device.
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.seed = seed
        self.weight_version = weight_version
        self.max_batch_size = max_batch_size
        # Seconds each batch waits before it runs: a slow engine on purpose, so a test can act
        # (kill the engine, say) while requests are in flight. 0 in every real run.
        self.batch_delay_s = float(batch_delay_s)
        self.gpu_ids = tuple(gpu_ids)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        self.model = model.to(self.device).eval()
        self.config = self.model.config
        self.vocab_size = int(self.config.vocab_size)
        self.max_positions = int(self.config.max_position_embeddings)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.pad_token_id = (self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                             else (self.eos_token_id or 0))
        self.released = False
        self.requests_served = 0
        self.requests_in_flight = 0  # accepted, not yet answered
        self.batches_run = 0
        self._seeds = random.Random(seed)
        self._seed_lock = threading.Lock()
        # HF fast tokenizers raise "Already borrowed" when two threads use one at once.
        self._tokenizer_lock = threading.Lock()
        # Held while weights change (refit, release, resume) and while they are hashed, never
        # while generating: info() reads them without waiting behind queued batches.
        self._weights_lock = threading.Lock()
        self._spill_dir = Path(tempfile.mkdtemp(prefix="slime-engine-"))
        self._queue: queue.Queue[Any] = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name="engine-worker", daemon=True)
        self._worker.start()

    # ---- requests -------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text` as the tokenizer makes them (special tokens added)."""
        with self._tokenizer_lock:
            return list(self.tokenizer(text).input_ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`."""
        with self._tokenizer_lock:
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def next_seed(self) -> int:
        """A seed for a request that sent none: drawn from the engine's seed, in arrival order."""
        with self._seed_lock:
            return self._seeds.randrange(2**31)

    def sequences(self, prompts: Sequence[GenerateInput]) -> list[GenerateRequest]:
        """The sequences parsed `/generate` prompts ask for: `n` each, in order, seeded.

        With `sampling_seed` s the n samples of a prompt draw with s, s+1, … (the same seed
        would give n copies of one sample); without one, each draws the engine's next seed.
        """
        return [GenerateRequest.of(p, p.params.seed + k if p.params.seed is not None else self.next_seed())
                for p in prompts for k in range(p.params.n)]

    def check_request(self, input_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise `EngineInputError` when the prompt or its parameters cannot be served."""
        if not input_ids:
            raise EngineInputError("input_ids is empty; send at least one token")
        bad = [t for t in input_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineInputError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        bad_stop = [t for t in params.stop_token_ids if not 0 <= t < self.vocab_size]
        if bad_stop:
            raise EngineInputError(f"stop_token_ids {bad_stop[:5]} are outside [0, {self.vocab_size})")
        if len(input_ids) + params.max_new_tokens > self.max_positions:
            raise EngineInputError(
                f"prompt of {len(input_ids)} tokens + max_new_tokens {params.max_new_tokens} exceeds "
                f"the model's {self.max_positions} positions; shorten one of them")

    def submit(self, requests: Sequence[GenerateRequest]) -> cf.Future[tuple[list[Generation], str]]:
        """Queue `requests` (batched with whatever else is waiting); a future of what `generate` returns.

        The HTTP layer awaits this future on its event loop instead of parking a thread per request.
        """
        for r in requests:
            self.check_request(r.input_ids, r.params)
        future: cf.Future[tuple[list[Generation], str]] = cf.Future()
        self.enqueue([(requests, future)])
        return future

    def enqueue(self, jobs: Sequence[tuple[Sequence[GenerateRequest], cf.Future[Answer]]]) -> None:
        """Queue several callers' checked requests at once, each answered through its own future.

        They reach the worker as one queue item, which it splits job by job into batches of at
        most `max_batch_size` sequences: requests that arrived together start in one batch
        instead of the first of them starting a batch alone while the rest are still queued.
        """
        item: list[Job] = []
        for requests, future in jobs:
            count = len(requests)
            with self._seed_lock:
                self.requests_in_flight += count

            def done(_: object, count: int = count) -> None:
                with self._seed_lock:
                    self.requests_in_flight -= count
            future.add_done_callback(done)
            item.append((list(requests), future))
        if item:
            self._queue.put(("generate", item, None))

    def generate(self, requests: Sequence[GenerateRequest],
                 timeout: float | None = None) -> tuple[list[Generation], str]:
        """Sample `requests` (batched with whatever else is waiting); blocks until done.

        Returns the generations and the weight version that produced them (read inside the
        batch: a refit queued behind it cannot be reported in its place).
        """
        return self.submit(requests).result(timeout)

    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run `fn` on the worker thread, between batches; returns its result or raises its error."""
        future: cf.Future[Any] = cf.Future()
        self._queue.put(("call", fn, future))
        return future.result(timeout)

    def _serve(self) -> None:
        carry: deque[Job] = deque()  # jobs of a queue item that did not fit the last batch: next in line
        held = None  # a control call (or the stop marker) met while filling a batch: after `carry`
        while True:
            if not carry:
                item = self._queue.get() if held is None else held
                held = None
                if item is _STOP:
                    return
                kind, payload, future = item
                if kind == "call":
                    self._run(future, payload)
                    continue
                carry = deque(payload)
            jobs: list[Job] = []
            size = 0
            # Fill the batch job by job: from what is carried, then from the generations already
            # waiting; a control call stops the merge (it runs after them, keeping the order).
            while True:
                while carry and (not jobs or size + len(carry[0][0]) <= self.max_batch_size):
                    job = carry.popleft()
                    jobs.append(job)
                    size += len(job[0])
                if carry or held is not None or size >= self.max_batch_size:
                    break
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP or nxt[0] != "generate":
                    held = nxt
                    break
                carry = deque(nxt[1])
            self._run_batch(jobs)

    @staticmethod
    def _run(future: cf.Future[Any], fn: Callable[[], Any]) -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)

    def _run_batch(self, jobs: list[tuple[list[GenerateRequest],
                                          cf.Future[tuple[list[Generation], str]]]]) -> None:
        flat = [r for reqs, _ in jobs for r in reqs]
        version = self.weight_version
        try:
            if self.released:
                raise EngineInputError("the engine's weights are released; "
                                       "POST /resume_memory_occupation before generating")
            if self.batch_delay_s > 0:
                time.sleep(self.batch_delay_s)
            outs = generate(self.model, [r.input_ids for r in flat], [r.params for r in flat],
                            eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id,
                            seeds=[r.seed for r in flat],
                            decode=lambda ids: self.decode(ids, skip_special_tokens=False),
                            reports=[(r.logprob_start_len, r.top_logprobs_num) for r in flat])
        except BaseException as exc:
            for _, future in jobs:
                future.set_exception(exc)
            return
        self.batches_run += 1
        self.requests_served += len(flat)
        start = 0
        for reqs, future in jobs:
            future.set_result((outs[start:start + len(reqs)], version))
            start += len(reqs)

    # ---- weights --------------------------------------------------------------------------
    def _expected(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def _load(self, named: Mapping[str, torch.Tensor], *, complete: bool) -> None:
        if self.released:
            raise EngineInputError("the engine's weights are released; "
                                   "POST /resume_memory_occupation before updating them")
        expected = self._expected()
        try:
            check_named_tensors(named, expected, complete=complete)
        except ValueError as exc:
            raise EngineInputError(str(exc)) from None
        with torch.no_grad(), self._weights_lock:
            for name, t in named.items():
                expected[name].copy_(t.to(device=self.device, dtype=expected[name].dtype))

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        """Load every weight from a Hugging Face model directory; set the version when one is given."""
        def work() -> None:
            try:
                named = read_checkpoint(model_path)
            except ValueError as exc:
                raise EngineInputError(str(exc)) from None
            self._load(named, complete=True)
            self.model_path = str(model_path)
            if weight_version is not None:
                self.weight_version = weight_version
        self.call(work)

    def update_weights_from_tensor(self, named: Mapping[str, torch.Tensor],
                                   weight_version: str | None = None) -> None:
        """Overwrite the named parameters (any subset); set the version when one is given."""
        def work() -> None:
            self._load(named, complete=False)
            if weight_version is not None:
                self.weight_version = weight_version
        self.call(work)

    def set_weight_version(self, version: str) -> None:
        """Name the current weights (between batches)."""
        def work() -> None:
            self.weight_version = version
        self.call(work)

    # ---- sleep / wake ---------------------------------------------------------------------
    def _tensors(self) -> list[tuple[str, torch.Tensor]]:
        return named_tensors(self.model)

    def weights_digest(self) -> str | None:
        """`tensors_digest` of the served weights; None while released.

        Two engines, or one engine at two moments, hold the same weights exactly when their
        digests match: what proves a frozen engine was never refit.
        """
        with self._weights_lock:
            return None if self.released else tensors_digest(self._tensors())

    def model_bytes(self) -> int:
        """Bytes the model's parameters and buffers hold on the engine's device now."""
        return _tensor_bytes([t for _, t in self._tensors() if t.device == self.device])

    def release_memory(self) -> None:
        """Move every weight out (a file in the engine's temp dir) and free it on the device."""
        def work() -> None:
            if self.released:
                return
            from safetensors.torch import save_file

            tensors = self._tensors()
            save_file({n: t.detach().to("cpu").contiguous() for n, t in tensors},
                      str(self._spill_dir / "weights.safetensors"))
            with self._weights_lock:
                for _, t in tensors:
                    # An empty tensor in place keeps the module tree (and its hooks) intact.
                    t.data = torch.empty(0, dtype=t.dtype, device=self.device)
                self.released = True
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self.call(work)

    def resume_memory(self) -> None:
        """Bring back exactly the weights `release_memory` moved out."""
        def work() -> None:
            if not self.released:
                return
            from safetensors.torch import load_file

            path = self._spill_dir / "weights.safetensors"
            saved = load_file(str(path))
            with self._weights_lock:
                for name, t in self._tensors():
                    t.data = saved[name].to(self.device)
                self.released = False
            path.unlink()
        self.call(work)

    def flush_cache(self) -> None:
        """Wait for the work queued before it: no KV cache outlives its batch, so none is kept."""
        self.call(lambda: None)

    # ---- state ----------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """What tests and entries read: device, GPU ids, pid, bytes held, version, counters."""
        return {
            "model_path": self.model_path,
            "device": str(self.device),
            "gpu_ids": list(self.gpu_ids),
            "pid": os.getpid(),
            "model_bytes": self.model_bytes(),
            "weights_digest": self.weights_digest(),
            "memory_released": self.released,
            "weight_version": self.weight_version,
            "seed": self.seed,
            "max_batch_size": self.max_batch_size,
            "batch_delay_s": self.batch_delay_s,
            "requests_served": self.requests_served,
            "requests_in_flight": self.requests_in_flight,
            "batches_run": self.batches_run,
            "cuda_memory_allocated": (torch.cuda.memory_allocated(self.device)
                                      if self.device.type == "cuda" else None),
        }

    def close(self) -> None:
        """Stop the worker thread and remove the spill directory."""
        if self._worker.is_alive():
            self._queue.put(_STOP)
            self._worker.join(timeout=30)
        shutil.rmtree(self._spill_dir, ignore_errors=True)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
