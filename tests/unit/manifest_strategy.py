"""Random GRPOJob manifests for the property test (tests/integration/test_crd_property.py), derived from the
models: the strategy walks the spec's OpenAPI schema, which the pydantic models generate (api/crd.py), so a
field added to a model is drawn with its type, bounds, enum, pattern and length without a line here.

Each value is mostly valid and sometimes not (a bound crossed, a value outside the enum, the wrong type), so
that about half of the whole manifests come out valid and both directions of the property get exercised.
``OVERRIDES`` holds the few paths where the schema alone draws badly: values that must also satisfy the
cross-field CEL rules often enough (the loss type against epsilon, the client-rollout knobs), and names,
URIs and quantities whose interesting cases a pattern does not show. tests/unit/test_manifest_strategy.py
checks that every field of the schema is drawn.
"""

from __future__ import annotations

import math
from typing import Any

from grpo_operator.api import GROUP, VERSION
from grpo_operator.api.crd import build_crd
from grpo_operator.api.dataset_uri import DATASET_URI_PATTERN
from hypothesis import strategies as st

ABSENT = object()
SPEC_SCHEMA: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
    "spec"
]
# Printable ASCII: what a pattern's character classes are drawn from (the API server's RE2 and pydantic's
# regex agree on it; the hand-picked values below cover spaces and tabs).
_PRINTABLE = st.characters(min_codepoint=32, max_codepoint=126)
# Longest string drawn at a maxLength bound; longer bounds (prompts, templates) are crossed by other values.
_LONGEST_AT_BOUND = 1024


# One draw per manifest, shared by every value in it: whether this manifest may hold invalid values at all.
# Without it, one value in forty invalid over a hundred fields would leave almost no manifest valid.
_BREAKING = st.shared(st.booleans(), key="manifest_strategy.breaking")


def _pick(valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid value; in a manifest that may break, one time in forty an invalid one."""
    return _BREAKING.flatmap(
        lambda breaking: st.integers(0, 39).flatmap(lambda i: invalid if breaking and i == 0 else valid)
    )


def _opt(strategy: st.SearchStrategy[Any], *, null: bool = True) -> st.SearchStrategy[Any]:
    """The value, or the key left out, or (optionally) an explicit null (which means unset)."""
    options = [strategy, st.just(ABSENT)]
    if null:
        options.append(st.none())
    return st.one_of(*options)


def _obj(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not ABSENT})


_WRONG_TYPES = st.sampled_from(["1", True, [], {}])


def _ints(lo: int, hi: int, bad_lo: int, bad_hi: int) -> st.SearchStrategy[Any]:
    """Integers in [lo, hi] (valid), or from the wider [bad_lo, bad_hi], or of the wrong type."""
    return _pick(st.integers(lo, hi), st.one_of(st.integers(bad_lo, bad_hi), _WRONG_TYPES, st.just(2.5)))


def _floats(lo: float, hi: float, bad: list[float]) -> st.SearchStrategy[Any]:
    valid = st.one_of(
        st.floats(lo, hi, allow_nan=False, allow_infinity=False, exclude_min=True),
        st.sampled_from([hi]),
    )
    return _pick(valid, st.one_of(st.sampled_from(bad), _WRONG_TYPES))


NAMES = _pick(
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
_LABELS = _pick(
    st.sampled_from([{"app": "dspy"}, {"app.kubernetes.io/name": "nb", "team": ""}]),
    st.sampled_from([{}, {"bad key": "x"}, {"app": "-x"}, {"/app": "x"}]),
)

# The lists OVERRIDES draws whole, items included (a field added to their items is drawn only once it is
# added there), with the reason.
WHOLE_LISTS: dict[str, str] = {
    "grpo.lora.targetModules": "module names a model has, and the empty list and name the rules refuse",
    "environment.egressCidrs": "CIDRs of both families, and addresses that are not CIDRs",
    "scheduling.tolerations": "the combinations of operator, value and effect Kubernetes accepts, and not",
}
# Optional fields drawn as if required: spec.rollouts.client applies only beside its source.
ALWAYS_DRAWN = frozenset({"rollouts.source"})
# path (wire names, dotted; "[]" for a list's items) -> the strategy drawn there instead of the schema's.
OVERRIDES: dict[str, st.SearchStrategy[Any]] = {
    "model.name": _TEXTS,
    "dataset.train": _DATASET_URIS,
    "dataset.validation": _DATASET_URIS,
    "dataset.promptTemplate": _pick(
        st.sampled_from(["Q: {prompt}", "{prompt}\nA:"]), st.just("no placeholder")
    ),
    "grpo.groupSize": _ints(2, 16, -1, 300),
    "grpo.promptsPerStep": _ints(1, 8, -1, 0),
    "grpo.steps": _ints(1, 1_000_000, -1, 0),
    "grpo.learningRate": _floats(0, 1, [0, -1e-6, 1.5]),
    "grpo.temperature": _floats(0, 100, [0, 0.0, -1, 100.5]),
    "grpo.topP": _floats(0, 1, [0, 1.0000001, -0.5]),
    "grpo.beta": _floats(0, 1, [-0.1]),
    # The preset's values count in the rules on epsilon and the loss type (CEL and pydantic alike).
    "grpo.epsilon": _floats(0.1, 0.3, [0, 1.2]),
    "grpo.epsilonHigh": _floats(0.2, 1, [0, 0.05, 1.2]),
    "grpo.lossType": _pick(
        st.sampled_from(["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]),
        st.just("ppo"),
    ),
    "grpo.preset": _pick(st.sampled_from(["dapo", "dr-grpo", "gspo"]), st.just("DAPO")),
    "grpo.numIterations": _ints(1, 8, 0, 9),
    "grpo.topK": _ints(0, 100, -5, -1),
    "grpo.chatTemplateKwargs": _pick(
        st.sampled_from([{"enable_thinking": "false"}, {}]),
        st.sampled_from([{"tokenize": "false"}, {"enable_thinking": False}]),
    ),
    "grpo.formatFailureScore": _floats(-2, -1, [0.0, 1, 5]),
    "grpo.failureScore": _floats(-0.5, 1, [-1, -3]),
    "grpo.lora.r": _ints(1, 1024, 0, 2000),
    "grpo.lora.dropout": _pick(st.sampled_from([0, 0.0, 0.5, 0.99]), st.sampled_from([1.0, -0.1])),
    "grpo.lora.targetModules": _pick(
        st.lists(st.sampled_from(["q_proj", "v_proj"]), min_size=1, max_size=3), st.sampled_from([[], [""]])
    ),
    "grpo.validation.everySteps": _ints(0, 3, -1, -1),
    "grpo.validation.maxPrompts": _ints(1, 3, 0, 0),
    "metric.image": _TEXTS,
    "metric.port": _ints(1, 65535, 0, 70000),
    "metric.errorBudget": _pick(st.sampled_from([0, 0.05, 1, 1.0]), st.sampled_from([-0.5, 1.5])),
    "environment.image": _TEXTS,
    "environment.port": _ints(1, 65535, 0, 70000),
    "environment.replicas": _ints(1, 64, 0, 65),
    "environment.maxTurns": _ints(1, 64, 0, 65),
    "environment.maxTurnTokens": _ints(1, 131072, 0, 131073),
    "environment.runtimeClassName": _pick(st.just("gvisor"), st.just("")),
    "environment.egressCidrs": _pick(
        st.lists(st.sampled_from(["10.0.0.0/8", "2001:db8::/32", "192.168.1.0/24"]), max_size=2),
        st.sampled_from([["10.0.0.0"], ["everywhere/8"], ["1" * 50 + "/8"]]),
    ),
    "environment.actionField": _pick(
        st.sampled_from(["message", "_a1"]), st.sampled_from(["1x", "a-b", "a" * 65])
    ),
    "environment.errorBudget": _floats(0, 1, [-0.5, 1.5]),
    "environment.reward": _pick(st.sampled_from(["Final", "Sum"]), st.just("Mean")),
    # Mostly 0: above it, a job must be an environment job without the knobs asynchronous rollouts refuse.
    "grpo.maxStaleness": _pick(st.sampled_from([0, 0, 0, 1]), st.integers(2, 8)),
    "rollouts.source": _pick(st.sampled_from(["Metric", "Client", "Client"]), st.just("Arbor")),
    "rollouts.client.allowFrom.[].podLabels": _LABELS,
    "rollouts.client.allowFrom.[].namespaceLabels": _LABELS,
    "rollouts.client.tokenSecretRef.name": _pick(st.just("dspy-token"), st.just("Bad_Name")),
    "rollouts.client.tokenSecretRef.key": st.just("token"),
    "generation.gpus": _ints(1, 8, -1, 9),
    "generation.tensorParallelSize": _ints(1, 8, 0, 9),
    "generation.gpuMemoryUtilization": _floats(0, 1, [0, 1.1]),
    "generation.maxModelLen": _ints(1, 10, 0, 0),
    "trainer.nodes": _ints(1, 2, 0, 65),
    "trainer.gpusPerNode": _ints(1, 8, 0, 9),
    "trainer.perDeviceBatchSize": _ints(1, 4, 0, 0),
    "checkpoints.everySteps": _ints(1, 3, 0, 0),
    "checkpoints.volume.existingClaim": _pick(st.just("claim"), st.sampled_from(["Bad_Claim", ""])),
    "checkpoints.volume.size": _QUANTITIES.filter(lambda q: isinstance(q, str)),
    "scheduling.tolerations": st.lists(_TOLERATION, max_size=2),
    "scheduling.queueName": _pick(st.just("team-a"), st.sampled_from(["Team_A", ""])),
    "runPolicy.backoffLimit": _ints(0, 3, -1, -1),
    "runPolicy.activeDeadlineSeconds": _ints(1, 3, 0, 0),
    "suspend": _pick(st.booleans(), st.just("no")),
}


def _python_regex(pattern: str) -> str:
    # The schema's ^...$ as a full match: Python's $ also matches before a final newline, RE2's does not.
    return r"\A" + pattern.removeprefix("^").removesuffix("$") + r"\Z"


def _integer(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    lo, hi = int(schema.get("minimum", -(2**31))), int(schema.get("maximum", 2**31 - 1))
    valid = st.one_of(st.sampled_from([lo, hi]), st.integers(lo, hi))
    bad: list[Any] = [
        b for b, bounded in ((lo - 1, "minimum" in schema), (hi + 1, "maximum" in schema)) if bounded
    ]
    return _pick(valid, st.one_of(st.sampled_from(bad or [2.5]), _WRONG_TYPES, st.just(2.5)))


def _number(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    excl_lo, excl_hi = bool(schema.get("exclusiveMinimum")), bool(schema.get("exclusiveMaximum"))
    valid: list[st.SearchStrategy[Any]] = [
        st.floats(
            lo,
            hi,
            exclude_min=excl_lo and lo is not None,
            exclude_max=excl_hi and hi is not None,
            allow_nan=False,
            allow_infinity=False,
        )
    ]
    bad: list[Any] = []
    for bound, excluded, outward in ((lo, excl_lo, -math.inf), (hi, excl_hi, math.inf)):
        if bound is None:
            continue
        if excluded:
            bad.append(float(bound))
        else:
            valid.append(st.just(bound))
            bad.append(math.nextafter(float(bound), outward))
    return _pick(
        st.one_of(*valid), st.one_of(st.sampled_from(bad or ["0.5"]), st.sampled_from(["0.5", True]))
    )


def _string(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "enum" in schema:
        return _pick(st.sampled_from(schema["enum"]), st.sampled_from(["Bogus", ""]))
    lo, hi = int(schema.get("minLength", 0)), int(schema.get("maxLength", _LONGEST_AT_BOUND))
    if "pattern" in schema:
        valid = st.from_regex(_python_regex(schema["pattern"]), alphabet=_PRINTABLE).filter(
            lambda s: lo <= len(s) <= hi
        )
        invalid = st.sampled_from([" bad", "Bad Value!", "a" * (hi + 1) if hi < _LONGEST_AT_BOUND else 1])
    else:
        valid = st.sampled_from(["x" * max(lo, 1), *(["a" * hi] if hi <= _LONGEST_AT_BOUND else [])])
        invalid = st.sampled_from(["a" * (hi + 1) if hi < _LONGEST_AT_BOUND else 1, *([""] if lo else [1])])
    return _pick(valid, st.one_of(invalid, st.just(1)))


def _map(schema: dict[str, Any], path: str) -> st.SearchStrategy[Any]:
    values = schema["additionalProperties"]
    quantities = values.get("x-kubernetes-int-or-string") is True
    keys = st.sampled_from(["cpu", "memory"] if quantities else ["a", "b", "team"])
    size = (int(schema.get("minProperties", 0)), min(int(schema.get("maxProperties", 2)), 2))
    drawn = st.dictionaries(
        keys, from_schema(values, f"{path}.*", in_list=True), min_size=size[0], max_size=size[1]
    )
    return _pick(drawn, _WRONG_TYPES)


def _list(schema: dict[str, Any], path: str) -> st.SearchStrategy[Any]:
    items = from_schema(schema["items"], f"{path}.[]", in_list=True)
    lo, hi = int(schema.get("minItems", 0)), min(int(schema.get("maxItems", 2)), 2)
    keys = schema.get("x-kubernetes-list-map-keys")
    unique = (
        (lambda item: tuple(str(item.get(k)) for k in keys) if isinstance(item, dict) else id(item))
        if keys
        else None
    )
    drawn = st.lists(items, min_size=lo, max_size=max(lo, hi), unique_by=unique)
    return _pick(drawn, st.sampled_from([[] if lo else 1, "1"]))


def _present(strategy: st.SearchStrategy[Any], path: str, *, null: bool) -> st.SearchStrategy[Any]:
    """An optional field: as ``_opt`` where OVERRIDES tunes it (or a field below it); a field drawn from the
    schema alone is given one time in six, so that its cross-field rules leave enough manifests valid."""
    if any(p == path or p.startswith(f"{path}.") for p in OVERRIDES):
        return _opt(strategy, null=null)
    rare = [st.just(ABSENT)] * (4 if null else 5) + ([st.none()] if null else [])
    return st.integers(0, 5).flatmap(lambda i: strategy if i == 0 else rare[i - 1])


def from_schema(schema: dict[str, Any], path: str = "", *, in_list: bool = False) -> st.SearchStrategy[Any]:
    """Values for the field at ``path`` (dotted wire names) as its schema describes it; ``OVERRIDES`` first.

    An object's optional fields are each left out or given (or null, outside lists: the models and the API
    server both read null as unset); its required fields are always given."""
    if path in OVERRIDES:
        return OVERRIDES[path]
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return _QUANTITIES
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return st.just({})
    if kind == "object" and "properties" in schema:
        required = set(schema.get("required", ()))
        fields = {}
        for name, prop in schema["properties"].items():
            at = f"{path}.{name}".lstrip(".")
            value = from_schema(prop, at, in_list=in_list)
            fields[name] = (
                value if name in required or at in ALWAYS_DRAWN else _present(value, at, null=not in_list)
            )
        return _obj(**fields)
    if kind == "object" and "additionalProperties" in schema:
        return _map(schema, path)
    if kind == "array":
        return _list(schema, path)
    if kind == "integer":
        return _integer(schema)
    if kind == "number":
        return _number(schema)
    if kind == "boolean":
        return _pick(st.booleans(), st.just("true"))
    if kind == "string":
        return _string(schema)
    raise AssertionError(f"spec.{path}: no strategy for the schema {schema}: add one here")


_SPEC_FIELDS = {name: from_schema(prop, name) for name, prop in SPEC_SCHEMA["properties"].items()}
# The parts every job starts with; rollouts, metric, dataset and environment are then chosen together so
# that the rules between them (a client-rollout job has no metric or dataset, an environment no metric) are
# mostly kept.
_ALWAYS = ("model", "dataset", "grpo", "metric")
_TOGETHER = ("rollouts", "environment")
# What a client-rollout job refuses in spec.grpo; left out of most client-rollout jobs.
_CLIENT_REFUSES = (
    "dynamicSampling",
    "validation",
    "numIterations",
    "topK",
    "minP",
    "repetitionPenalty",
    "vllmImportanceSamplingMode",
)


@st.composite
def job_manifests(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {name: draw(_SPEC_FIELDS[name]) for name in _ALWAYS}
    for name, strategy in _SPEC_FIELDS.items():
        if name in _ALWAYS or name in _TOGETHER:
            continue
        value = draw(_present(strategy, name, null=True))
        if value is not ABSENT:
            spec[name] = value
    # spec.rollouts: a client-rollout job usually leaves out metric and dataset (as it must), a metric job
    # sometimes does (as it must not).
    rollouts = draw(st.one_of(_SPEC_FIELDS["rollouts"], st.just(ABSENT)))
    if rollouts is not ABSENT:
        spec["rollouts"] = rollouts
    client = isinstance(rollouts, dict) and rollouts.get("source") == "Client"
    for key in ("metric", "dataset"):
        if draw(st.integers(0, 9)) < (8 if client else 1):
            del spec[key]
    # spec.environment: usually instead of spec.metric (as it must be), sometimes beside it (as it must not).
    environment = draw(st.one_of(_SPEC_FIELDS["environment"], st.just(ABSENT), st.just(ABSENT)))
    if environment is not ABSENT:
        spec["environment"] = environment
        if draw(st.integers(0, 9)) < 8:
            spec.pop("metric", None)
    if client and draw(st.integers(0, 9)) < 8 and isinstance(spec["grpo"], dict):
        # Mostly without the knobs a client-rollout job refuses, so that valid ones are common too.
        for knob in _CLIENT_REFUSES:
            spec["grpo"].pop(knob, None)
    if draw(st.integers(0, 39)) == 0:
        spec[draw(st.sampled_from(["replicas", "extra"]))] = 1
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GRPOJob",
        "metadata": {"name": draw(NAMES)},
        "spec": spec,
    }
