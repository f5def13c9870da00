"""Trainer rank 0's policy server (client-rollout jobs, port ``rollouts.policyPort``): OpenAI-compatible
``POST /v1/chat/completions`` and ``POST /v1/completions`` sampled from the current policy, which the
rollout gateway forwards its clients' requests to. Also ``GET /v1/models`` and ``GET /healthz``.

Backends: ``transformers`` samples in-process from the training model under :class:`PolicyLock` (never
during a training step); ``vllm-server`` sends the prompt's token ids to the job's vLLM server through
TRL's VLLMClient, whose weights TRL syncs before every step. Chats are rendered by the trainer
(client_rollouts.render_prompt_text), so the completion a client sends back is trained on exactly the
prompt it was sampled from, and every sample is recorded in a SampleBook, so it is trained on exactly the
tokens sampled, with their log-probabilities (sample_book.py). Honoured: max_tokens / max_completion_tokens
(capped at grpo.maxCompletionLength), temperature, top_p, n, stop (cut after sampling), logprobs (the
sampled tokens' log-probabilities, in OpenAI's shape for each route) and vLLM's return_token_ids (the
choice's token_ids and prompt_token_ids); other fields are ignored.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from grpo_trainer.client_rollouts import PolicyLock, prompt_ids, text_ids
from grpo_trainer.sample_book import SampleBook, SampledTokens

log = logging.getLogger("grpo_trainer.policy_server")

MAX_BODY_BYTES = 16 * 1024 * 1024
# How long a closing server waits for the requests it accepted: a few completions' worth of sampling, short
# enough to stay well inside the pod's termination grace period after a SIGTERM checkpoint.
DRAIN_SECONDS = 30.0


class BadRequest(ValueError):
    """A request the server cannot answer; the message names the field."""


@dataclass(frozen=True)
class Sampling:
    n: int
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str]


@dataclass(frozen=True)
class Sample:
    """One sampled completion: its text, why it ended ("stop" or "length"), the token ids it was sampled as
    (the end token included when the model emitted one) and, when the sampler reports them, each token's
    log-probability under the sampling distribution (temperature applied); None when it cannot be had
    (greedy sampling, a stop string cut inside a token)."""

    text: str
    finish_reason: str
    token_ids: tuple[int, ...] | None
    logprobs: tuple[float, ...] | None = None

    @property
    def tokens(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else 0


# (prompt token ids, sampling) -> the n samples.
Sampler = Callable[[list[int], Sampling], list[Sample]]


def sampling_of(
    body: dict[str, Any], max_completion_length: int, default_temperature: float, default_top_p: float
) -> Sampling:
    def number(key: str, default: float, low: float, high: float) -> float:
        value = body.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise BadRequest(f"{key} must be a number")
        if not low <= value <= high:
            raise BadRequest(f"{key} must be between {low} and {high}")
        return float(value)

    requested = body.get("max_completion_tokens", body.get("max_tokens"))
    if requested is None:
        max_tokens = max_completion_length
    elif isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise BadRequest("max_tokens / max_completion_tokens must be a positive integer")
    else:
        # Longer completions than grpo.maxCompletionLength could not be trained on as sampled.
        max_tokens = min(requested, max_completion_length)
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128:
        raise BadRequest("n must be an integer from 1 to 128")
    stop = body.get("stop")
    stops = (
        [stop]
        if isinstance(stop, str)
        else [s for s in stop if isinstance(s, str) and s]
        if isinstance(stop, list)
        else []
    )
    return Sampling(
        n=n,
        max_tokens=max_tokens,
        temperature=number("temperature", default_temperature, 0.0, 10.0),
        top_p=number("top_p", default_top_p, 0.0, 1.0) or 1.0,
        stop=stops,
    )


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    cut = min((text.index(s) for s in stops if s in text), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def transformers_sampler(trainer: Any, tokenizer: Any) -> Sampler:
    """Sample from the training model in-process (PolicyServer calls it under the policy lock, so never
    during a training step)."""
    import torch

    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id)

    def sample(ids: list[int], sampling: Sampling) -> list[Sample]:
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                inputs = torch.tensor([ids] * sampling.n, device=model.device)
                greedy = sampling.temperature == 0.0
                extra: dict[str, Any] = (
                    {} if greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p}
                )
                out = model.generate(
                    input_ids=inputs,
                    attention_mask=torch.ones_like(inputs),
                    do_sample=not greedy,
                    max_new_tokens=sampling.max_tokens,
                    pad_token_id=pad,
                    eos_token_id=eos,
                    return_dict_in_generate=True,
                    output_logits=True,
                    **extra,
                )
                generated = out.sequences[:, len(ids) :]
                logprobs = None
                if not greedy and out.logits:
                    # The sampling distribution's log-probabilities as the trainer computes its own: the raw
                    # logits over the temperature (top-p only cuts the tail the sampled token is not in).
                    logits = torch.stack(out.logits, dim=1).float() / sampling.temperature
                    chosen = generated[:, : logits.shape[1]].unsqueeze(-1)
                    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, chosen).squeeze(-1).tolist()
        finally:
            model.train(was_training)
        results = []
        for i, row in enumerate(generated.tolist()):
            tokens = row[: row.index(eos) + 1] if eos in row else row
            finished = bool(tokens) and tokens[-1] == eos
            results.append(
                Sample(
                    tokenizer.decode(tokens, skip_special_tokens=True),
                    "stop" if finished else "length",
                    tuple(tokens),
                    tuple(logprobs[i][: len(tokens)]) if logprobs is not None else None,
                )
            )
        return results

    return sample


def vllm_sampler(trainer: Any, tokenizer: Any) -> Sampler:
    """Sample through the job's vLLM server with TRL's client (rank 0 holds it in server mode); under the
    policy lock, so never while TRL pushes new weights to the server."""
    from grpo_trainer.trl_adapter import vllm_client

    client = vllm_client(trainer)
    eos = int(tokenizer.eos_token_id)

    def sample(ids: list[int], sampling: Sampling) -> list[Sample]:
        # logprobs=0: the sampled token's log-probability only, as TRL asks for it in metric jobs.
        output = client.generate(
            prompts=[ids],
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            logprobs=0,
        )
        reported = output.get("logprobs") or [None] * len(output["completion_ids"])
        results = []
        for tokens, per_token in zip(output["completion_ids"], reported, strict=False):
            finished = bool(tokens) and tokens[-1] == eos
            logprobs = _sampled_logprobs(per_token, len(tokens))
            results.append(
                Sample(
                    tokenizer.decode(tokens, skip_special_tokens=True),
                    "stop" if finished else "length",
                    tuple(tokens),
                    logprobs,
                )
            )
        return results

    return sample


def _sampled_logprobs(per_token: Any, length: int) -> tuple[float, ...] | None:
    """The sampled tokens' log-probabilities from TRL's (seq_len, k) list (logprobs=0: the sampled token's
    alone); None when the server's answer does not have one number per token."""
    if not isinstance(per_token, list) or len(per_token) != length:
        return None
    out = []
    for top in per_token:
        value = top[0] if isinstance(top, list) and top else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        out.append(float(value))
    return tuple(out)


class PolicyServer:
    """The HTTP server, in daemon threads of rank 0."""

    def __init__(
        self,
        port: int,
        served_model: str,
        tokenizer: Any,
        sampler: Sampler,
        *,
        max_completion_length: int,
        temperature: float,
        top_p: float,
        lock: PolicyLock | None = None,
        host: str = "0.0.0.0",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        book: SampleBook | None = None,
    ):
        # Held around tokenising, sampling and decoding: the training thread holds it during a step, and
        # a fast tokenizer must not be used from two threads at once.
        self.lock = lock or PolicyLock()
        self.served_model = served_model
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.max_completion_length = max_completion_length
        self.temperature, self.top_p = temperature, top_p
        # spec.grpo.chatTemplateKwargs: the rollout function renders the client's chats with the same ones.
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        # Every answered sample, for training on exactly its tokens (client_rollouts.make_rollout_func).
        self.book = book if book is not None else SampleBook()
        self.requests = 0
        # Requests being answered, so close() lets them finish: a client whose request was accepted gets an
        # answer, never a dropped connection because the trainer exited under it.
        self._in_flight = 0
        self._idle = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def _answer(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/healthz":
                    self._answer(200, {"status": "ok"})
                elif path in ("/v1/models", "/models"):
                    self._answer(200, {"object": "list", "data": [server.model_entry()]})
                else:
                    self._answer(404, error_body(f"no route GET {path}", "not_found"))

            def do_POST(self) -> None:
                path = self.path.split("?", 1)[0].rstrip("/")
                routes = {
                    "/v1/chat/completions": server.chat,
                    "/chat/completions": server.chat,
                    "/v1/completions": server.completions,
                    "/completions": server.completions,
                }
                handler = routes.get(path)
                if handler is None:
                    self._answer(404, error_body(f"no route POST {path}", "not_found"))
                    return
                with server.answering():
                    self._post(handler)

            def _post(self, handler: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length > MAX_BODY_BYTES:
                        raise BadRequest(f"the request body is larger than {MAX_BODY_BYTES} bytes")
                    body = json.loads(self.rfile.read(length) or b"{}")
                    if not isinstance(body, dict):
                        raise BadRequest("the request body must be a JSON object")
                    with server.lock.sampling():
                        answer = handler(body)
                    self._answer(200, answer)
                except (BadRequest, json.JSONDecodeError) as exc:
                    self._answer(400, error_body(str(exc), "invalid_request_error"))
                except Exception as exc:  # a sampling failure must answer, not hang the client
                    log.exception("policy server: %s failed", self.path)
                    self._answer(500, error_body(f"{type(exc).__name__}: {exc}", "server_error"))

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="policy-server", daemon=True)

    def start(self) -> PolicyServer:
        self._thread.start()
        log.info("policy server on port %d serving %s", self.port, self.served_model)
        return self

    @contextmanager
    def answering(self) -> Iterator[None]:
        with self._idle:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def close(self, drain_seconds: float = DRAIN_SECONDS) -> None:
        """Stop accepting, then wait up to ``drain_seconds`` for the requests being answered."""
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._idle:
            if not self._idle.wait_for(lambda: self._in_flight == 0, timeout=drain_seconds):
                log.warning(
                    "policy server: %d request(s) still being answered after %.0f s; the trainer exits "
                    "without them",
                    self._in_flight,
                    drain_seconds,
                )

    def model_entry(self) -> dict[str, Any]:
        return {"id": self.served_model, "object": "model", "created": 0, "owned_by": "grpo-operator"}

    def _sampling(self, body: dict[str, Any]) -> Sampling:
        return sampling_of(body, self.max_completion_length, self.temperature, self.top_p)

    def _run(self, ids: list[int], sampling: Sampling) -> list[Sample]:
        self.requests += 1
        out = []
        for sample in self.sampler(ids, sampling):
            cut, stopped = cut_at_stop(sample.text, sampling.stop)
            if stopped:
                sample = self._stopped(sample, cut)
            if sample.token_ids is not None:
                self.book.record(ids, sample.text, SampledTokens(sample.token_ids, sample.logprobs))
            out.append(sample)
        return out

    def _stopped(self, sample: Sample, text: str) -> Sample:
        """``sample`` cut at a stop string: the tokens whose text is exactly ``text``, or no tokens when the
        cut falls inside a token (then the client's text cannot be trained on as sampled)."""
        ids = sample.token_ids or ()

        def decoded(k: int) -> str:
            return str(self.tokenizer.decode(list(ids[:k]), skip_special_tokens=True))

        # The shortest prefix whose text is at least as long as the cut text (prefix texts grow with k), by
        # bisection: a completion of thousands of tokens is not decoded thousands of times under the lock.
        low, high = 0, len(ids)
        while low < high:
            middle = (low + high) // 2
            if len(decoded(middle)) >= len(text):
                high = middle
            else:
                low = middle + 1
        # Tokens that decode to nothing (special ones) may follow: the shortest matching prefix is the one.
        for k in range(low, min(low + 2, len(ids)) + 1):
            if decoded(k) == text:
                logprobs = sample.logprobs[:k] if sample.logprobs is not None else None
                return Sample(text, "stop", ids[:k], logprobs)
        return Sample(text, "stop", None, None)

    def _token_texts(self, sample: Sample) -> list[str]:
        # As the completion's text is decoded: special tokens (an end token) show as nothing, so the
        # offsets index the text the client got.
        return [self.tokenizer.decode([token], skip_special_tokens=True) for token in sample.token_ids or ()]

    def _extras(self, body: dict[str, Any], prompt: list[int], sample: Sample) -> dict[str, Any]:
        """vLLM's return_token_ids fields on a choice, when asked for."""
        if body.get("return_token_ids") is not True:
            return {}
        return {"prompt_token_ids": list(prompt), "token_ids": list(sample.token_ids or [])}

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            raise BadRequest("messages must be a non-empty list of {role, content} with text content")
        chat = [{"role": m["role"], "content": m["content"]} for m in messages]
        ids = prompt_ids(self.tokenizer, chat, self.chat_template_kwargs)
        results = self._run(ids, self._sampling(body))
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self.served_model),
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": sample.text},
                    "finish_reason": sample.finish_reason,
                    "logprobs": self._chat_logprobs(sample) if body.get("logprobs") is True else None,
                    **self._extras(body, ids, sample),
                }
                for i, sample in enumerate(results)
            ],
            "usage": usage(len(ids), results),
        }

    def _chat_logprobs(self, sample: Sample) -> dict[str, Any] | None:
        """The chat route's logprobs object: one entry per sampled token."""
        if sample.logprobs is None:
            return None
        return {
            "content": [
                {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
                for text, logprob in zip(self._token_texts(sample), sample.logprobs, strict=True)
            ]
        }

    def _text_logprobs(self, sample: Sample) -> dict[str, Any] | None:
        """The completions route's logprobs object: tokens, their log-probabilities and text offsets."""
        if sample.logprobs is None:
            return None
        texts = self._token_texts(sample)
        offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
        return {
            "tokens": texts,
            "token_logprobs": list(sample.logprobs),
            "top_logprobs": None,
            "text_offset": offsets,
        }

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise BadRequest("prompt must be a string or a non-empty list of strings")
        sampling = self._sampling(body)
        wants_logprobs = isinstance(body.get("logprobs"), int) and not isinstance(body.get("logprobs"), bool)
        choices: list[dict[str, Any]] = []
        prompt_tokens = 0
        completion_tokens = 0
        for text_prompt in prompts:
            ids = text_ids(self.tokenizer, text_prompt)
            results = self._run(ids, sampling)
            prompt_tokens += len(ids)
            completion_tokens += sum(sample.tokens for sample in results)
            for sample in results:
                choices.append(
                    {
                        "index": len(choices),
                        "text": sample.text,
                        "finish_reason": sample.finish_reason,
                        "logprobs": self._text_logprobs(sample) if wants_logprobs else None,
                        **self._extras(body, ids, sample),
                    }
                )
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self.served_model),
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def usage(prompt_tokens: int, results: list[Sample]) -> dict[str, int]:
    completion = sum(sample.tokens for sample in results)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
