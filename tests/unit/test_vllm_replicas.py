"""The routing and weight rules of several vLLM replicas (trainer_image/grpo_trainer/vllm_replicas.py), with
servers that record what they were asked and what weights they hold. The same rules run against two real
vLLM servers in tests/trainer/test_vllm_weight_sync.py."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from grpo_trainer.vllm_replicas import NoReplicaServing, ReplicaPool
from grpo_trainer.vllm_wait import lost_server


class Server:
    """A vLLM server as the pool sees it through its client: the weights version it serves, the prompts it
    sampled (with the version they were sampled from), and whether it is up."""

    def __init__(self, name: str, sync_dir: Path) -> None:
        self.base_url = f"http://{name}:8000"
        self.model = "tiny"
        self.session = None
        self.sync_dir = sync_dir
        self.version = "base"
        self.up = True
        self.sampled: list[tuple[Any, str, int]] = []
        self.syncs = 0
        self.fail_next_generate = False

    def _check_up(self) -> None:
        if not self.up:
            raise requests.ConnectionError(f"connection to {self.base_url} refused")

    def generate(self, prompts: list[Any], features: Any = None, n: int = 1, **params: Any) -> dict[str, Any]:
        self._check_up()
        if self.fail_next_generate:
            self.fail_next_generate = False
            self.up = False
            raise requests.ConnectionError("connection reset by peer")
        self.sampled.extend((p, self.version, n) for p in prompts)
        return {
            "prompt_ids": [[p] for p in prompts],
            "completion_ids": [[p, i] for p in prompts for i in range(n)],
            "logprobs": [[[-0.5]] for _ in prompts for _ in range(n)],
            "logprob_token_ids": [[[p]] for p in prompts for _ in range(n)],
        }

    def write_version(self, named_params: Iterator[tuple[str, Any]]) -> Path:
        self.syncs += 1
        version = self.sync_dir / f"v{self.syncs:06d}"
        version.mkdir(parents=True)
        (version / "weights").write_text(str(dict(named_params)))
        return version

    def reload(self, version: Path) -> None:
        self._check_up()
        self.version = version.name

    def prune(self, keep: Path) -> None:
        for entry in self.sync_dir.iterdir():
            if entry != keep:
                (entry / "weights").unlink()
                entry.rmdir()

    def init_communicator(self, device: Any = 0) -> None:
        return None

    def close_communicator(self) -> None:
        return None

    def reset_prefix_cache(self) -> None:
        self._check_up()


@pytest.fixture
def servers(tmp_path: Path) -> list[Server]:
    return [Server(f"gen-r{i}", tmp_path) for i in range(2)]


def pool_of(servers: list[Server]) -> ReplicaPool:
    by_url = {s.base_url: s for s in servers}
    return ReplicaPool(list(servers), healthy=lambda url: by_url[url].up)


def push(pool: ReplicaPool, step: int) -> None:
    pool.update_named_params([], iter([("w", step)]))


def test_each_prompt_goes_whole_to_one_replica_and_the_answers_keep_the_prompts_order(
    servers: list[Server],
) -> None:
    pool = pool_of(servers)
    out = pool.generate(prompts=[10, 11, 12, 13, 14], n=4, temperature=1.0)
    assert out["prompt_ids"] == [[10], [11], [12], [13], [14]]
    assert out["completion_ids"] == [[p, i] for p in range(10, 15) for i in range(4)]
    assert len(out["logprobs"]) == len(out["logprob_token_ids"]) == 20
    # Contiguous parts, one per replica, every prompt asked once with all its n = G samples.
    assert [p for p, _, _ in servers[0].sampled] == [10, 11, 12]
    assert [p for p, _, _ in servers[1].sampled] == [13, 14]
    assert {n for s in servers for _, _, n in s.sampled} == {4}
    assert pool.report()["prompts"] == [3, 2]


def test_new_work_goes_to_the_least_loaded_replica_first(servers: list[Server]) -> None:
    pool = pool_of(servers)
    pool.generate(prompts=[1, 2, 3], n=1)  # replica 0 took 2 prompts, replica 1 took 1
    pool.generate(prompts=[4, 5, 6], n=1)
    assert [p for p, _, _ in servers[1].sampled] == [3, 4, 5]
    assert [p for p, _, _ in servers[0].sampled] == [1, 2, 6]


def test_a_replica_lost_mid_request_leaves_the_pool_and_its_prompts_are_sampled_by_the_other(
    servers: list[Server],
) -> None:
    pool = pool_of(servers)
    push(pool, 1)
    servers[1].fail_next_generate = True
    out = pool.generate(prompts=[1, 2, 3, 4], n=2)
    assert out["prompt_ids"] == [[1], [2], [3], [4]]
    assert [p for p, _, _ in servers[0].sampled] == [1, 2, 3, 4]
    assert pool.report()["serving"] == [0]
    pool.generate(prompts=[5, 6], n=2)
    assert [p for p, _, _ in servers[0].sampled][-2:] == [5, 6]
    assert servers[1].sampled == []


def test_a_replaced_replica_gets_the_current_weights_before_it_is_sent_any_work(
    servers: list[Server],
) -> None:
    pool = pool_of(servers)
    push(pool, 1)
    servers[1].up = False
    pool.generate(prompts=[1, 2], n=1)  # replica 1 is found gone here
    push(pool, 2)  # while it is down: only replica 0 reloads
    assert (servers[0].version, servers[1].version) == ("v000002", "v000001")
    # The operator's replacement comes up serving the base model: it is not sent work before a sync.
    servers[1].up, servers[1].version = True, "base"
    pool.generate(prompts=[3, 4], n=1)
    assert servers[1].sampled == []
    push(pool, 3)
    assert pool.report()["rejoined"] == [1]
    assert (servers[0].version, servers[1].version) == ("v000003", "v000003")
    pool.generate(prompts=[5, 6], n=1)
    # Every sample, on either server, came from the newest weights pushed before it; the rejoined replica,
    # the less loaded, took the first part.
    assert servers[1].sampled == [(5, "v000003", 1)]
    assert [v for p, v, _ in servers[0].sampled if p >= 5] == ["v000003"]
    # Only the newest version stays on the volume, for a replica that joins later.
    assert [e.name for e in servers[0].sync_dir.iterdir()] == ["v000003"]


def test_a_replica_that_misses_a_reload_is_not_read_from(servers: list[Server]) -> None:
    pool = pool_of(servers)
    push(pool, 1)

    def lost_reload(version: Path) -> None:
        raise requests.ConnectionError("connection refused")

    servers[1].reload = lost_reload  # type: ignore[method-assign]
    push(pool, 2)
    assert pool.report()["serving"] == [0]
    pool.generate(prompts=[1, 2, 3], n=1)
    assert servers[1].sampled == []


def test_with_every_replica_gone_the_caller_sees_a_lost_server(servers: list[Server]) -> None:
    pool = pool_of(servers)
    for server in servers:
        server.up = False
    with pytest.raises(NoReplicaServing) as raised:
        pool.generate(prompts=[1, 2], n=1)
    # What the trainer's wait for a replacement keys on (weight_sync.lost_server).
    assert lost_server(raised.value)
    assert "replica 0" in str(raised.value) and "replica 1" in str(raised.value)
    with pytest.raises(NoReplicaServing):
        push(pool, 1)
    assert not pool.any_answering()
    servers[0].up = True
    assert pool.any_answering()
    push(pool, 2)
    assert pool.report()["serving"] == [0]


def test_an_error_that_is_the_requests_own_is_raised_not_routed_around(servers: list[Server]) -> None:
    pool = pool_of(servers)

    def bad_request(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ValueError("HTTP 400: max_tokens is too large")

    servers[1].generate = bad_request  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="HTTP 400"):
        pool.generate(prompts=[1, 2], n=1)
    assert pool.report()["serving"] == [0, 1]


def test_the_pool_answers_every_call_trl_makes_on_its_vllm_client() -> None:
    """TRL's trainer and its VLLMGeneration call methods of ``vllm_client``; the pool stands in for that client
    with several replicas, so a TRL upgrade that calls a new one must fail here, not in a user's job."""
    spec = importlib.util.find_spec("trl")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    called: set[str] = set()
    for module in ("generation/vllm_generation.py", "trainer/grpo_trainer.py"):
        called |= set(re.findall(r"vllm_client\.(\w+)\(", (root / module).read_text()))
    assert {"generate", "update_named_params", "get_server_info"} <= called, called
    missing = sorted(name for name in called if not callable(getattr(ReplicaPool, name, None)))
    assert not missing, f"ReplicaPool lacks {missing}, which TRL calls on its vLLM client"


def test_the_served_model_probe_checks_every_serving_replica_and_reports_the_furthest(
    servers: list[Server],
) -> None:
    from grpo_trainer.served_generation import probe_served
    from grpo_trainer.weight_sync import ServedModelProbe

    class Probe(ServedModelProbe):
        def __init__(self) -> None:  # no tokenizer: the probe text's log-probabilities are given below
            pass

        def served_logprobs(self, client: Any) -> list[float]:
            if not client.up:
                raise requests.ConnectionError("connection refused")
            return [-1.0, -2.0] if client is servers[0] else [-1.5, -2.0]

    pool = pool_of(servers)
    worst = probe_served(Probe(), [-1.0, -2.0], pool)
    assert worst.mean_abs_diff == 0.25 and pool.report()["logprob_diff"] == {"0": 0.0, "1": 0.25}
    servers[1].up = False
    assert probe_served(Probe(), [-1.0, -2.0], pool).mean_abs_diff == 0.0
    assert pool.report()["serving"] == [0]
    servers[0].up = False
    with pytest.raises(NoReplicaServing) as raised:
        probe_served(Probe(), [-1.0, -2.0], pool)
    assert lost_server(raised.value)
