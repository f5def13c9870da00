"""Property: the pydantic models and the API server (OpenAPI schema + CEL rules) give the same
verdict on any GRPOJob. Random manifests cluster around every bound and rule, so a constraint
stated in one place and not the other is found quickly."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pydantic
from grpo_operator.api import GROUP, PLURAL, VERSION, GRPOJob, describe_validation_error
from grpo_operator.api.crd import build_crd
from grpo_operator.api.dataset_uri import DATASET_URI_PATTERN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from tests.harness.kube import Cluster
from tests.unit.manifests import base_manifest

_ABSENT = object()


def _pick(valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a valid value, sometimes an invalid one: about half of the whole manifests come out
    valid, so both directions of the property get exercised."""
    return st.integers(0, 39).flatmap(lambda i: invalid if i == 0 else valid)


def _opt(strategy: st.SearchStrategy[Any], *, null: bool = True) -> st.SearchStrategy[Any]:
    """The value, or the key left out, or (optionally) an explicit null (which means unset)."""
    options = [strategy, st.just(_ABSENT)]
    if null:
        options.append(st.none())
    return st.one_of(*options)


def _obj(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not _ABSENT})


_WRONG_TYPES = st.sampled_from(["1", True, [], {}])

_LABELS = _pick(
    st.sampled_from([{"app": "dspy"}, {"app.kubernetes.io/name": "nb", "team": ""}]),
    st.sampled_from([{}, {"bad key": "x"}, {"app": "-x"}, {"/app": "x"}]),
)
_ROLLOUTS = _obj(
    source=_pick(st.sampled_from(["Metric", "Client", "Client"]), st.just("Arbor")),
    client=_opt(
        _obj(
            allowFrom=_opt(st.lists(_obj(podLabels=_LABELS, namespaceLabels=_opt(_LABELS)), max_size=2)),
            tokenSecretRef=_opt(
                _obj(name=_pick(st.just("dspy-token"), st.just("Bad_Name")), key=st.just("token"))
            ),
        )
    ),
)


def _ints(lo: int, hi: int, bad_lo: int, bad_hi: int) -> st.SearchStrategy[Any]:
    """Integers in [lo, hi] (valid), or from the wider [bad_lo, bad_hi], or of the wrong type."""
    return _pick(st.integers(lo, hi), st.one_of(st.integers(bad_lo, bad_hi), _WRONG_TYPES, st.just(2.5)))


def _floats(lo: float, hi: float, bad: list[float]) -> st.SearchStrategy[Any]:
    valid = st.one_of(
        st.floats(lo, hi, allow_nan=False, allow_infinity=False, exclude_min=True),
        st.sampled_from([hi]),
    )
    return _pick(valid, st.one_of(st.sampled_from(bad), _WRONG_TYPES))


_NAMES = _pick(
    st.one_of(
        st.sampled_from(["job", "a", "a-b", "a" * 40, "ab9"]),
        st.from_regex(r"\A[a-z]([-a-z0-9]{0,38}[a-z0-9])?\Z"),
    ),
    st.one_of(
        st.sampled_from(["a" * 41, "1a", "a-", "job.v1"]), st.from_regex(r"\A[a-z0-9][-.a-z0-9]{0,44}\Z")
    ),
)
_TEXTS = _pick(
    st.sampled_from(["x", "Qwen/Qwen2.5-0.5B", "/models/tiny", "ghcr.io/a/b:1", "a" * 512]),
    st.sampled_from(["", "with space", "tab\there", "a" * 513]),
)
_DATASET_URIS = _pick(
    st.one_of(
        st.sampled_from(
            [
                "hf://openai/gsm8k",
                "hf://openai/gsm8k:main#test",
                "hf://gsm8k@v1#train[:10%]",
                "file:///workspace/a.jsonl",
                "file:///a.parquet",
            ]
        ),
        st.from_regex(DATASET_URI_PATTERN, fullmatch=True).filter(lambda s: len(s) <= 2048),
    ),
    st.one_of(
        st.sampled_from(["hf://a/b/c", "hf://", "s3://b/k.jsonl", "file://rel/a.json", "file:///a.csv", ""]),
        st.text(alphabet="hf:/.#@[]%ab-_9 ile", max_size=24),
    ),
)
_QUANTITIES = _pick(
    st.sampled_from(["500m", "1Gi", "2", 2, 0, "1.5", "1e3", "1Ki", "0.5Gi", ".5"]),
    st.sampled_from([-1, "-1", "abc", "", "1.5.5", "1Gb", 1.5]),
)
_TOLERATION = _pick(
    st.one_of(
        st.just({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
        st.just({"key": "team", "operator": "Equal", "value": "ml"}),
        st.just({"key": "spot", "effect": "NoExecute", "tolerationSeconds": 30}),
        st.just({"operator": "Exists"}),
    ),
    _obj(
        key=_opt(st.sampled_from(["", "nvidia.com/gpu", "team"]), null=False),
        operator=_opt(st.sampled_from(["Exists", "Equal", "In"]), null=False),
        value=_opt(st.sampled_from(["", "x"]), null=False),
        effect=_opt(st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule", "Bad"]), null=False),
        tolerationSeconds=_opt(st.integers(-1, 100), null=False),
    ),
)


_ENVIRONMENT = _obj(
    image=_TEXTS,
    port=_opt(_ints(1, 65535, 0, 70000)),
    replicas=_opt(_ints(1, 64, 0, 65)),
    maxTurns=_opt(_ints(1, 64, 0, 65)),
    maxTurnTokens=_opt(_ints(1, 131072, 0, 131073)),
    runtimeClassName=_opt(_pick(st.just("gvisor"), st.just(""))),
    egressCidrs=_opt(
        _pick(
            st.lists(st.sampled_from(["10.0.0.0/8", "2001:db8::/32", "192.168.1.0/24"]), max_size=2),
            st.sampled_from([["10.0.0.0"], ["everywhere/8"], ["1" * 50 + "/8"]]),
        )
    ),
    actionField=_opt(_pick(st.sampled_from(["message", "_a1"]), st.sampled_from(["1x", "a-b", "a" * 65]))),
    errorBudget=_opt(_floats(0, 1, [-0.5, 1.5])),
    reward=_opt(_pick(st.sampled_from(["Final", "Sum"]), st.just("Mean"))),
)


@st.composite
def job_manifests(draw: st.DrawFn) -> dict[str, Any]:
    grpo = draw(
        _obj(
            groupSize=_ints(2, 16, -1, 300),
            promptsPerStep=_ints(1, 8, -1, 0),
            steps=_ints(1, 1_000_000, -1, 0),
            learningRate=_opt(_floats(0, 1, [0, -1e-6, 1.5])),
            temperature=_opt(_floats(0, 100, [0, 0.0, -1, 100.5])),
            topP=_opt(_floats(0, 1, [0, 1.0000001, -0.5])),
            beta=_opt(_floats(0, 1, [-0.1])),
            epsilon=_opt(_floats(0.1, 0.3, [0, 1.2])),
            epsilonHigh=_opt(_floats(0.2, 1, [0, 0.05, 1.2])),
            lossType=_opt(
                _pick(
                    st.sampled_from(["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]),
                    st.just("ppo"),
                )
            ),
            # The preset's values count in the rules on epsilon and the loss type (CEL and pydantic alike).
            preset=_opt(_pick(st.sampled_from(["dapo", "dr-grpo", "gspo"]), st.just("DAPO"))),
            importanceSamplingLevel=_opt(_pick(st.sampled_from(["token", "sequence"]), st.just("group"))),
            numIterations=_opt(_ints(1, 8, 0, 9)),
            maskTruncatedCompletions=_opt(_pick(st.booleans(), st.just("true"))),
            topK=_opt(_ints(0, 100, -5, -1)),
            vllmImportanceSamplingMode=_opt(
                _pick(
                    st.sampled_from(["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]),
                    st.just("token"),
                )
            ),
            chatTemplateKwargs=_opt(
                _pick(
                    st.sampled_from([{"enable_thinking": "false"}, {}]),
                    st.sampled_from([{"tokenize": "false"}, {"enable_thinking": False}]),
                )
            ),
            scaleRewards=_opt(_pick(st.sampled_from(["group", "batch", "none"]), st.just("None"))),
            formatFailureScore=_opt(_floats(-2, -1, [0.0, 1, 5])),
            failureScore=_opt(_floats(-0.5, 1, [-1, -3])),
            dynamicSampling=_opt(_pick(st.booleans(), st.just("true"))),
            lora=_opt(
                _obj(
                    enabled=_opt(st.booleans()),
                    r=_opt(_ints(1, 1024, 0, 2000)),
                    dropout=_opt(_pick(st.sampled_from([0, 0.0, 0.5, 0.99]), st.sampled_from([1.0, -0.1]))),
                    targetModules=_opt(
                        _pick(
                            st.lists(st.sampled_from(["q_proj", "v_proj"]), min_size=1, max_size=3),
                            st.sampled_from([[], [""]]),
                        )
                    ),
                )
            ),
            validation=_opt(_obj(everySteps=_opt(_ints(0, 3, -1, -1)), maxPrompts=_opt(_ints(1, 3, 0, 0)))),
        )
    )
    spec: dict[str, Any] = {
        "model": draw(
            _obj(
                name=_TEXTS,
                revision=_opt(_TEXTS),
                dtype=_opt(_pick(st.sampled_from(["bfloat16", "float32"]), st.just("int8"))),
            )
        ),
        "dataset": draw(_obj(train=_DATASET_URIS, validation=_opt(_DATASET_URIS))),
        "grpo": grpo,
        "metric": draw(
            _obj(
                image=_TEXTS,
                port=_opt(_ints(1, 65535, 0, 70000)),
                errorBudget=_opt(_pick(st.sampled_from([0, 0.05, 1, 1.0]), st.sampled_from([-0.5, 1.5]))),
                env=_opt(
                    _pick(
                        st.lists(
                            _obj(
                                name=st.sampled_from(["A", "B", "-ok", "_X"]),
                                value=_opt(st.just("v"), null=False),
                            ),
                            max_size=3,
                            unique_by=lambda e: e["name"],
                        ),
                        st.sampled_from([[{"name": "A"}, {"name": "A"}], [{"name": "9X"}], [{"value": "v"}]]),
                    )
                ),
                resources=_opt(
                    _obj(requests=_opt(st.dictionaries(st.sampled_from(["cpu", "memory"]), _QUANTITIES)))
                ),
            )
        ),
    }
    optional_objects = {
        "generation": _obj(
            gpus=_opt(_ints(1, 8, -1, 9)),
            tensorParallelSize=_opt(_ints(1, 8, 0, 9)),
            gpuMemoryUtilization=_opt(_floats(0, 1, [0, 1.1])),
            maxModelLen=_opt(_ints(1, 10, 0, 0)),
        ),
        "trainer": _obj(
            nodes=_opt(_ints(1, 2, 0, 65)),
            gpusPerNode=_opt(_ints(1, 8, 0, 9)),
            perDeviceBatchSize=_opt(_ints(1, 4, 0, 0)),
        ),
        "checkpoints": _obj(
            everySteps=_opt(_ints(1, 3, 0, 0)),
            retention=_opt(_pick(st.sampled_from(["Retain", "Delete"]), st.just("Keep"))),
            volume=_opt(
                _obj(
                    existingClaim=_opt(_pick(st.just("claim"), st.sampled_from(["Bad_Claim", ""]))),
                    size=_opt(_QUANTITIES.filter(lambda q: isinstance(q, str))),
                    accessMode=_opt(
                        _pick(st.sampled_from(["ReadWriteOnce", "ReadWriteMany"]), st.just("ReadOnlyMany"))
                    ),
                )
            ),
        ),
        "scheduling": _obj(
            tolerations=_opt(st.lists(_TOLERATION, max_size=2)),
            queueName=_opt(_pick(st.just("team-a"), st.sampled_from(["Team_A", ""]))),
        ),
        "runPolicy": _obj(
            backoffLimit=_opt(_ints(0, 3, -1, -1)), activeDeadlineSeconds=_opt(_ints(1, 3, 0, 0))
        ),
        "suspend": _pick(st.booleans(), st.just("no")),
    }
    for key, strategy in optional_objects.items():
        value = draw(_opt(strategy))
        if value is not _ABSENT:
            spec[key] = value
    # spec.rollouts: a client-rollout job usually leaves out metric and dataset (as it must), a metric job
    # sometimes does (as it must not).
    rollouts = draw(st.one_of(_ROLLOUTS, st.just(_ABSENT)))
    if rollouts is not _ABSENT:
        spec["rollouts"] = rollouts
    client = isinstance(rollouts, dict) and rollouts.get("source") == "Client"
    for key in ("metric", "dataset"):
        if draw(st.integers(0, 9)) < (8 if client else 1):
            del spec[key]
    # spec.environment: usually instead of spec.metric (as it must be), sometimes beside it (as it must not).
    environment = draw(st.one_of(_ENVIRONMENT, st.just(_ABSENT), st.just(_ABSENT)))
    if environment is not _ABSENT:
        spec["environment"] = environment
        if draw(st.integers(0, 9)) < 8:
            spec.pop("metric", None)
    if client and draw(st.integers(0, 9)) < 8:
        # Mostly without the knobs a client-rollout job refuses, so that valid ones are common too.
        for knob in ("dynamicSampling", "validation", "numIterations", "topK", "vllmImportanceSamplingMode"):
            spec["grpo"].pop(knob, None)
    if draw(st.integers(0, 39)) == 0:
        spec[draw(st.sampled_from(["replicas", "extra"]))] = 1
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GRPOJob",
        "metadata": {"name": draw(_NAMES)},
        "spec": spec,
    }


def _model_verdict(manifest: dict[str, Any]) -> tuple[bool, str]:
    try:
        GRPOJob.model_validate(manifest)
    except pydantic.ValidationError as exc:
        return False, "\n".join(describe_validation_error(exc))
    return True, ""


def as_kubectl_sends(value: Any) -> Any:
    """The manifest as kubectl puts it on the wire: YAML/JSON numbers like 4.0 become the integer 4.

    A raw client that sends JSON 4.0 instead gets a CEL type error on the integer fields that
    cross-field rules read (documented in docs/api.md); kubectl users never do, and neither does
    the model, which treats 4.0 as 4.
    """
    if isinstance(value, dict):
        return {k: as_kubectl_sends(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_kubectl_sends(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _server_verdict(api: CustomObjectsApi, namespace: str, manifest: dict[str, Any]) -> tuple[bool, str]:
    try:
        api.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            as_kubectl_sends(manifest),
            dry_run="All",
            field_validation="Strict",
        )
    except ApiException as exc:
        if exc.status in (400, 422):
            return False, str(exc.body)
        raise
    return True, ""


def test_model_and_api_server_agree_on_random_jobs(kube: Cluster, namespace: str) -> None:
    api = CustomObjectsApi(kube.api_client())
    verdicts: Counter[bool] = Counter()

    @settings(
        max_examples=400,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(manifest=job_manifests())
    def check(manifest: dict[str, Any]) -> None:
        model_ok, model_why = _model_verdict(manifest)
        server_ok, server_why = _server_verdict(api, namespace, manifest)
        assert model_ok == server_ok, (
            f"pydantic says {'valid' if model_ok else 'invalid'}, the API server says "
            f"{'valid' if server_ok else 'invalid'}\nmanifest: {manifest}\npydantic: {model_why}\n"
            f"server: {server_why}"
        )
        verdicts[model_ok] += 1

    check()
    # Both verdicts must be common, or the property says little about one of the directions.
    assert verdicts[True] >= 20 and verdicts[False] >= 20, verdicts


def _leaf_fields(
    schema: dict[str, Any], path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every scalar field under ``schema`` reachable through objects only (not lists or maps)."""
    out: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    for name, prop in schema.get("properties", {}).items():
        if prop.get("type") == "object" and "properties" in prop:
            out.extend(_leaf_fields(prop, (*path, name)))
        elif prop.get("type") in ("integer", "number", "string", "boolean"):
            out.append(((*path, name), prop))
    return out


def _probes(prop: dict[str, Any]) -> list[Any]:
    """Values on both sides of each bound the schema states, plus one of each wrong type."""
    kind = prop["type"]
    values: list[Any] = []
    if kind == "integer":
        for bound in ("minimum", "maximum"):
            if bound in prop:
                b = int(prop[bound])
                values += [b - 1, b, b + 1]
        values += [float(prop.get("minimum", 1)), "1"]
    elif kind == "number":
        for bound, toward in (("minimum", math.inf), ("maximum", -math.inf)):
            if bound in prop:
                edge = float(prop[bound])
                values += [math.nextafter(edge, -toward), edge, math.nextafter(edge, toward)]
        values += ["0.5", True]
    elif kind == "string" and "enum" in prop:
        values += [*prop["enum"], "Bogus", ""]
    elif kind == "string" and "pattern" not in prop and "x-kubernetes-validations" not in prop:
        for bound in ("minLength", "maxLength"):
            if bound in prop:
                n = int(prop[bound])
                values += ["a" * max(n - 1, 0), "a" * n, "a" * (n + 1)]
        values.append(1)
    elif kind == "boolean":
        values += [True, False, "true", 0]
    return values


def test_model_and_api_server_agree_at_every_bound(kube: Cluster, namespace: str) -> None:
    """A sweep over every bound and enum of every spec field: a bound changed in the models but not
    in the checked-in CRD (or the other way round) disagrees here on the first run."""
    api = CustomObjectsApi(kube.api_client())
    spec_schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    checked = 0
    disagreements: list[str] = []
    for path, prop in _leaf_fields(spec_schema):
        for value in _probes(prop):
            manifest = base_manifest()
            node = manifest["spec"]
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
            model_ok, model_why = _model_verdict(manifest)
            server_ok, server_why = _server_verdict(api, namespace, manifest)
            checked += 1
            if model_ok != server_ok:
                disagreements.append(
                    f"spec.{'.'.join(path)} = {value!r}: pydantic {model_ok} ({model_why}), server {server_ok} "
                    f"({server_why[:300]})"
                )
    assert not disagreements, "\n".join(disagreements)
    assert checked > 150


def test_raw_json_float_in_a_cel_checked_integer_is_refused(kube: Cluster, namespace: str) -> None:
    """What docs/api.md says about clients that send 4.0 for an integer without kubectl's conversion."""
    api = CustomObjectsApi(kube.api_client())
    manifest = base_manifest()
    manifest["spec"]["grpo"]["groupSize"] = 4.0
    ok, why = _server_verdict(api, namespace, manifest)
    assert ok, why  # as kubectl sends it
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest, dry_run="All")
    except ApiException as exc:
        assert exc.status == 422 and "expected int, got float64" in str(exc.body)
    else:
        raise AssertionError("the API server accepted JSON 4.0 for spec.grpo.groupSize; update docs/api.md")
