"""The base class every API model derives from.

camelCase on the wire (the CRD and trainer.json), snake_case in Python. ``strict`` mode on purpose:
the API server rejects ``"8"`` for an integer and ``1.0`` for an integer, so the pydantic models must
too, or the hypothesis test that keeps the two in step would find them disagreeing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel

# json_schema_extra of a field whose default the models apply but the CRD must not: the API server writes a
# schema default into every stored object, after which "the user left it unset" can no longer be told
# apart (spec.grpo.preset fills only unset knobs). The CRD generator drops the default and this marker.
NO_SERVER_DEFAULT_KEY = "x-grpo-no-server-default"
NO_SERVER_DEFAULT: dict[str, Any] = {NO_SERVER_DEFAULT_KEY: True}


class RuleViolation(ValueError):
    """A broken cross-field rule: the pydantic twin of the API server rejecting ``rule``.

    ``field_path`` (relative, like a CEL ``fieldPath``) names the field the error is reported at.
    """

    def __init__(self, rule: CelRule, message: str | None = None) -> None:
        super().__init__(message or rule.message)
        self.rule = rule
        self.field_path = rule.field_path


class CelRule:
    """One ``x-kubernetes-validations`` entry; its pydantic twin is a validator on the same model.

    ``field_path`` (relative, e.g. ``.tensorParallelSize``) makes the API server report the error at
    that field instead of at the object that holds the rule. ``name`` is the attribute the rule is
    bound to in a :class:`CelRules` class (None for a rule that sits on a field's schema instead).

    ``message_expression`` (CEL, optional) is what the API server answers instead of ``message`` when it
    can evaluate it: the message with the object's own numbers in it. It must begin with ``message``, so
    the fixed text is what every side shows and the numbers follow; the pydantic validator passes the
    same text to :meth:`violation`, and tests/integration/test_crd_validation.py checks the two agree.
    """

    __slots__ = ("field_path", "message", "message_expression", "name", "rule")

    def __init__(
        self, rule: str, message: str, field_path: str | None = None, message_expression: str | None = None
    ) -> None:
        self.rule = rule
        self.message = message
        self.field_path = field_path
        self.message_expression = message_expression
        self.name: str | None = None

    def __set_name__(self, owner: type, name: str) -> None:
        if self.name is not None:
            raise TypeError(
                f"CEL rule {self.name!r} is bound a second time, as {owner.__qualname__}.{name}: "
                "write a separate CelRule for each model"
            )
        self.name = name

    def __repr__(self) -> str:
        return f"CelRule({self.name or self.rule!r})"

    def violation(self, detail: str = "") -> RuleViolation:
        """The pydantic-side error for this rule, reported at the same field as the API server's;
        ``detail`` is what the rule's ``message_expression`` appends to ``message`` for this object."""
        return RuleViolation(self, self.message + detail)

    def to_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.message_expression:
            out["messageExpression"] = self.message_expression
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


class _RuleNamespace(dict[str, Any]):
    """A class body that refuses to bind two CEL rules to one name (the second would silently win)."""

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, CelRule) and key in self:
            raise TypeError(f"two CEL rules are named {key!r} in one model: give each rule its own name")
        super().__setitem__(key, value)


class _CelRulesMeta(type):
    @classmethod
    def __prepare__(mcs, name: str, bases: tuple[type, ...], /, **kwargs: Any) -> _RuleNamespace:
        return _RuleNamespace()

    def __iter__(cls) -> Iterator[CelRule]:
        """The rules in the order they are written (the order the CRD lists them in)."""
        return (value for value in vars(cls).values() if isinstance(value, CelRule))


class CelRules(metaclass=_CelRulesMeta):
    """The CEL rules of one model, each bound to a name that says what it checks.

    A model declares them as a nested ``class Rules(CelRules)`` with one ``CelRule`` per attribute; the
    CRD generator attaches them, in the order written, to the model's schema, and the model's
    validators raise them by name (``raise self.Rules.tp_equals_gpus.violation()``), never by position.
    """


class ApiModel(BaseModel):
    """camelCase aliases, unknown fields rejected, strict types (see the module docstring)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        strict=True,
    )

    # CEL rules the CRD generator attaches to this object's schema; a model with rules replaces this
    # with its own nested ``class Rules(CelRules)``. Each rule is mirrored by a pydantic validator on
    # the same class; tests/unit/test_api_rules.py and the hypothesis test keep them in step.
    Rules: ClassVar[type[CelRules]] = CelRules

    @model_validator(mode="before")
    @classmethod
    def _null_means_unset(cls, data: Any) -> Any:
        # The API server prunes explicit nulls on non-nullable fields before defaulting, so
        # `temperature: null` means "use the default" there; it must mean the same here.
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    def to_dict(self) -> dict[str, Any]:
        """The wire form: camelCase keys, unset optional fields left out (the API server prunes nulls)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _loc_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + part
    return path


def describe_validation_error(exc: ValidationError, prefix: str = "") -> list[str]:
    """One ``<field path>: <message>`` line per error, with camelCase paths as in the manifest.

    ``prefix`` (e.g. ``"spec"``) is put in front when the model validated is not the whole object.
    """
    lines = []
    for err in exc.errors():
        path = _loc_path(tuple(err["loc"]))
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, RuleViolation) and cause.field_path:
            path += cause.field_path
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {message}" if path else message)
    return lines
