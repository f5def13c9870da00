"""How the asynchronous producer samples one step's groups (async_rollouts.py has the rules): one request
per group, several in flight, each group scored as soon as its G completions are back, and a weight push
that does not wait for the slowest group.

* **One request per group.** The step's B groups go to the vLLM server(s) as B requests of n = G, at most
  ``concurrency`` at a time (vLLM batches concurrent requests as it batches the prompts of one). A group's
  completions are back when its own longest completion ends, not the step's.
* **Scoring streamed.** A group that is back goes to the metric service at once (bounded by the metric's
  concurrency), while the other groups are still sampled and the trainer trains on an earlier step. The
  scores travel with the step's groups; the reward function uses a score only where the item it would
  send is the one that was scored (the same prompt, completion, dataset row, length and finish reason),
  and scores the rest on the spot. A failed streamed score is scored again in the step: nothing is lost,
  only the overlap.
* **Pushes that do not wait for groups not needed yet.** The producer (async_rollouts.py) interrupts a
  step's sampling when the trainer pushes new weights while groups of a later step than the one it
  trains next are in flight. The sampler then stops collecting, asks each server to abort its requests
  (vLLM's POST /abort_requests, served in dev mode, which the operator sets on generation pods), and
  returns the groups that were complete before the push began. The push then runs; the groups aborted
  are sampled again on the new weights. No group mixes two policy versions: every group is stamped with
  the version it was sampled on, and a group whose answer arrived after the push began is discarded,
  whatever it holds (an aborted request answers 200 with its tokens so far, indistinguishable from a
  short completion).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("grpo_trainer.group_sampling")

# Seconds an abort request may take: the server answers at once, or it is gone (then the groups in flight
# fail on their own, as with any lost server).
ABORT_TIMEOUT_SECONDS = 5.0


@dataclass
class GroupResult:
    """One group's completions from vLLM, the policy version that sampled them, and their streamed
    scoring."""

    prompt_ids: list[int]
    completion_ids: list[list[int]]
    logprobs: list[Any] | None
    logprob_token_ids: list[Any] | None
    version: int
    # The streamed scoring under way (one score per completion); the step's take reads it (a push never
    # waits for it).
    scoring: Future[list[Any]] | None = field(default=None, repr=False)


@dataclass
class StepRequest:
    """The groups of one step: their prompts' token ids (one per group) and, for streamed scoring, each
    completion row's prompt and dataset row (G per group, in order); what is sampled so far."""

    prompts: list[list[int]]
    row_prompts: list[Any] | None = None
    rows: list[dict[str, Any]] | None = None
    results: dict[int, GroupResult] = field(default_factory=dict)
    # Groups sampled again because a push stopped them.
    resampled: int = 0

    def complete(self) -> bool:
        return len(self.results) == len(self.prompts)


@dataclass
class SampledStep:
    """What the producer hands on for a step: TRL's payload, each group's version and each row's score."""

    payload: tuple[Any, Any, Any, Any]
    versions: list[int]
    scores: list[Any]
    resampled: int
    # Per group, its streamed scoring still under way (None: done or none): sampling the next step need
    # not wait for it, the step's take does (``finish_scoring``), before the step leaves rank 0.
    scoring: list[Future[list[Any]] | None] | None = None

    def finish_scoring(self) -> float:
        """Wait for the streamed scores still under way and put them in ``scores``; returns the seconds
        waited. A failed one leaves its completions to be scored in the step, by the reward function."""
        started = time.monotonic()
        if self.scoring is not None:
            size = len(self.scores) // max(1, len(self.scoring))  # every group has G completions
            for g, future in enumerate(self.scoring):
                if future is None:
                    continue
                try:
                    self.scores[g * size : (g + 1) * size] = future.result()
                except Exception as exc:
                    log.warning("streamed scoring of a group failed (%s: %s); it is scored in its step",
                                type(exc).__name__, str(exc)[:200])  # fmt: skip
            self.scoring = None
        return time.monotonic() - started


class Interrupted(Exception):
    """A weight push stopped the step's sampling; the groups complete before it are kept in the request."""


# Samples one group: (prompt ids, n) -> TRL's output dict for that one prompt.
GenerateOne = Callable[[list[int]], dict[str, Any]]
# Scores one group's completions: (request, group index, its result) -> one score per completion.
ScoreGroup = Callable[[StepRequest, int, GroupResult], list[Any]]


class GroupSampler:
    """The producer's ``generate`` for single-turn jobs (see the module's docstring)."""

    def __init__(
        self,
        generate_one: GenerateOne,
        version: Callable[[], int | None],
        server_urls: Callable[[], list[str]],
        concurrency: int,
        score_group: ScoreGroup | None = None,
        score_concurrency: int = 1,
    ) -> None:
        self._generate_one = generate_one
        self._version = version
        self._server_urls = server_urls
        self.concurrency = max(1, concurrency)
        self._score_group = score_group
        self._scoring = ThreadPoolExecutor(
            max_workers=max(1, score_concurrency), thread_name_prefix="grpo-score"
        )
        self._lock = threading.Lock()
        self._active = False
        self._cancel = threading.Event()
        # False once a server refused /abort_requests (not in dev mode): pushes wait for the groups then.
        self.can_abort = True

    def __call__(self, request: StepRequest) -> SampledStep:
        with self._lock:
            self._active = True
        try:
            return self._sample(request)
        finally:
            with self._lock:
                self._active = False
                self._cancel.clear()

    def _sample(self, request: StepRequest) -> SampledStep:
        version = self._version()
        assert version is not None, "the producer samples only once a version is served"
        todo = [g for g in range(len(request.prompts)) if g not in request.results]
        failure: BaseException | None = None
        # Not a with-block: an interrupted call returns at once, leaving the requests it gave up on to end
        # (aborted by the server) on their own threads; their answers are not read.
        pool = ThreadPoolExecutor(
            max_workers=min(len(todo), self.concurrency) or 1, thread_name_prefix="grpo-group"
        )
        try:
            pending = {pool.submit(self._generate_one, request.prompts[g]): g for g in todo}
            while pending and not self._cancel.is_set() and failure is None:
                done, _ = wait(pending, timeout=0.05, return_when=FIRST_COMPLETED)
                for future in done:
                    group = pending.pop(future)
                    if self._cancel.is_set():
                        break  # answered after the push began: possibly aborted midway, sampled again
                    try:
                        out = future.result()
                    except BaseException as exc:  # a group's failure fails the step's request (a lost server)
                        failure = failure or exc
                        continue
                    result = GroupResult(
                        prompt_ids=list(out["prompt_ids"][0]),
                        completion_ids=list(out["completion_ids"]),
                        logprobs=out.get("logprobs"),
                        logprob_token_ids=out.get("logprob_token_ids"),
                        version=version,
                    )
                    request.results[group] = result
                    if self._score_group is not None and request.rows is not None:
                        result.scoring = self._scoring.submit(self._score_group, request, group, result)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        if failure is not None:
            raise failure
        if not request.complete():
            missing = len(request.prompts) - len(request.results)
            request.resampled += missing
            raise Interrupted(f"{missing} groups stopped by a weight push")
        return assemble(request)

    def interrupt(self) -> bool:
        """The training thread, as a push begins: stop collecting groups and abort the servers' requests.
        True when a sampling call was stopped (its groups in flight will be sampled again); False when
        none was under way, or the servers cannot abort (the push waits for the call then)."""
        with self._lock:
            if not self._active or not self.can_abort:
                return False
            self._cancel.set()
        for url in self._server_urls():
            try:
                abort_requests(url)
            except urllib.error.HTTPError as exc:
                if exc.code in (404, 405):
                    self.can_abort = False
                    log.warning(
                        "the vLLM server at %s does not serve POST /abort_requests (HTTP %d; it needs "
                        "VLLM_SERVER_DEV_MODE=1, which the operator sets): weight pushes wait for the groups "
                        "in flight instead", url, exc.code,
                    )  # fmt: skip
            except OSError as exc:  # a lost server: its requests fail and the step samples anew
                log.info("aborting the requests of %s failed (%s)", url, exc)
        return True

    def close(self) -> None:
        self._scoring.shutdown(wait=False, cancel_futures=True)


def abort_requests(base_url: str) -> int:
    """vLLM's POST /abort_requests with no ids: every request the server is running ends now, answering
    with its tokens so far. Returns how many it aborted."""
    request = urllib.request.Request(
        base_url.rstrip("/") + "/abort_requests", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=ABORT_TIMEOUT_SECONDS) as response:
        body = json.loads(response.read(65536) or b"{}")
    aborted = body.get("aborted", 0) if isinstance(body, dict) else 0
    return int(aborted) if isinstance(aborted, int) else 0


def assemble(request: StepRequest) -> SampledStep:
    """The step's groups in order as TRL's payload (prompt ids per group; completions, log-probabilities
    and their token ids per completion), with each group's version and each completion's score."""
    groups = [request.results[g] for g in range(len(request.prompts))]
    has_logprobs = all(r.logprobs is not None for r in groups)
    has_ids = all(r.logprob_token_ids is not None for r in groups)
    payload = (
        [r.prompt_ids for r in groups],
        [ids for r in groups for ids in r.completion_ids],
        [lp for r in groups for lp in r.logprobs or []] if has_logprobs else None,
        [t for r in groups for t in r.logprob_token_ids or []] if has_ids else None,
    )
    # None until finish_scoring puts in what the streamed scoring returns.
    scores: list[Any] = [None] * len(payload[1])
    scoring = [r.scoring for r in groups]
    pending = scoring if any(f is not None for f in scoring) else None
    return SampledStep(payload, [r.version for r in groups], scores, request.resampled, pending)
