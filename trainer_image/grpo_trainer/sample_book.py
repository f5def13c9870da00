"""What the policy server sampled, so that a client's rollouts are trained on exactly those tokens.

A client (DSPy through the rollout gateway) sends back each completion as text. Tokenising that text again
need not give the ids that were sampled (a tokenizer's merges, a stop string cut inside a token, an end
token the text does not show), and the sampling log-probabilities are lost with the ids. So trainer rank 0
records every sample its policy server answers, keyed by the prompt's token ids and the completion text
the client received; when the client's groups arrive, each rollout is looked up: a match trains on the
sampled ids with the sampled log-probabilities (the importance-sampling correction metric jobs get), and
a rollout without one (a client that rewrote or made up the text, or a sample evicted from the book) is
tokenised from its text, trained without correction, and counted.

The book is bounded by the tokens it holds (oldest samples go first), since a client may sample far more
than it sends back.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

# Tokens (ids plus log-probabilities, 8 bytes a token) the book holds at most: 4M tokens, 32 MB, are many
# steps of B*G completions of maxCompletionLength even for large jobs.
MAX_BOOK_TOKENS = 4 * 1024 * 1024


@dataclass(frozen=True)
class SampledTokens:
    """The ids a completion was sampled as (its end token included when the model emitted one) and, when
    the sampler reported them, each token's log-probability under the sampling policy."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None


def _key(prompt_ids: Sequence[int], text: str) -> bytes:
    digest = hashlib.sha256()
    digest.update(array("q", prompt_ids).tobytes())
    digest.update(b"\0")
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.digest()


class SampleBook:
    """Samples by (prompt ids, completion text), oldest evicted first past ``max_tokens``; thread-safe
    (the policy server's handler threads record, the training thread looks up)."""

    def __init__(self, max_tokens: int = MAX_BOOK_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[bytes, tuple[array[int], array[float] | None]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, prompt_ids: Sequence[int], text: str, sampled: SampledTokens) -> None:
        key = _key(prompt_ids, text)
        ids = array("q", sampled.ids)
        logprobs = array("d", sampled.logprobs) if sampled.logprobs is not None else None
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._tokens -= len(old[0])
            # The same prompt and text sampled twice as different ids keeps the newer: either is a sample
            # of that text, and the newer one's log-probabilities are closer to the policy being trained.
            self._entries[key] = (ids, logprobs)
            self._tokens += len(ids)
            while self._tokens > self.max_tokens and len(self._entries) > 1:
                _, (evicted, _) = self._entries.popitem(last=False)
                self._tokens -= len(evicted)

    def lookup(self, prompt_ids: Sequence[int], text: str) -> SampledTokens | None:
        with self._lock:
            entry = self._entries.get(_key(prompt_ids, text))
        if entry is None:
            return None
        ids, logprobs = entry
        return SampledTokens(tuple(ids), tuple(logprobs) if logprobs is not None else None)
