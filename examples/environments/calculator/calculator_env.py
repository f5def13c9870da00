"""A multi-turn calculator environment in OpenEnv's format: the model computes with a tool, then answers.

Each episode is one arithmetic question from the job's dataset (reset receives the row's ``question`` and
``answer`` columns). Every model turn is one command, sent as the action ``{"message": <turn>}``:

- ``calc <expression>``: the calculator's result comes back as the next message (``+ - * / ( )`` on
  integers and decimals; anything else is an error message, not a crash);
- ``answer <number>``: ends the episode with reward 1.0 when it equals the row's answer, else 0.0.

Any other turn gets a reminder of the two commands. Turns that are not yet an answer earn a small format
credit, 0.5 x the share of their characters that belong to the command language (digits, operators,
"calc", "answer"), so that a model far from the task (the test suite's tiny random one) still has a slope to
climb; a correct answer is always worth more than any format credit.

Run it as its image does: ``uvicorn calculator_env:app --host 0.0.0.0 --port 8000``.
"""

from __future__ import annotations

import ast
import operator
from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

# Sessions one server keeps at once: each WebSocket connection (one episode) holds one.
MAX_SESSIONS = 256
COMMAND_CHARS = set("0123456789+-*/(). =calnswer")
FORMAT_CREDIT = 0.5
OPERATORS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_MAGNITUDE = 1e12


class CalculatorAction(Action):  # type: ignore[misc]
    message: str = Field(..., description="One command: 'calc <expression>' or 'answer <number>'.")


class CalculatorObservation(Observation):  # type: ignore[misc]
    text: str = Field(default="", description="The calculator's answer, or what went wrong.")


def evaluate(expression: str) -> float:
    """The arithmetic value of ``expression``; ValueError for anything that is not plain arithmetic."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            value = float(OPERATORS[type(node.op)](walk(node.left), walk(node.right)))
        elif isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            value = float(OPERATORS[type(node.op)](walk(node.operand)))
        else:
            raise ValueError("only numbers and + - * / ( ) are allowed")
        if abs(value) > MAX_MAGNITUDE:
            raise ValueError("the result is too large")
        return value

    if len(expression) > 200:
        raise ValueError("the expression is too long")
    try:
        return walk(ast.parse(expression.strip(), mode="eval"))
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except SyntaxError:
        raise ValueError("that is not an arithmetic expression") from None


def number_text(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.6g}"


def format_credit(turn: str) -> float:
    if not turn:
        return 0.0
    return FORMAT_CREDIT * sum(ch in COMMAND_CHARS for ch in turn.lower()) / len(turn)


class CalculatorEnvironment(Environment):  # type: ignore[misc]
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._answer = ""

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **row: Any
    ) -> CalculatorObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._answer = str(row.get("answer", "")).strip()
        question = str(row.get("question", "")).strip()
        return CalculatorObservation(text=f"question: {question}" if question else "", reward=0.0, done=False)

    def step(
        self, action: CalculatorAction, timeout_s: float | None = None, **extra: Any
    ) -> CalculatorObservation:  # type: ignore[override]
        self._state.step_count += 1
        turn = str(action.message).strip()
        command, _, argument = turn.partition(" ")
        if command == "answer":
            try:
                correct = number_text(evaluate(argument)) == number_text(evaluate(self._answer))
            except ValueError:
                correct = False
            return CalculatorObservation(
                text="correct" if correct else "wrong", reward=float(correct), done=True
            )
        if command == "calc":
            try:
                text = number_text(evaluate(argument))
            except ValueError as exc:
                text = f"error: {exc}"
            return CalculatorObservation(text=text, reward=format_credit(turn), done=False)
        return CalculatorObservation(
            text="use 'calc <expression>' or 'answer <number>'", reward=format_credit(turn), done=False
        )

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    CalculatorEnvironment,
    CalculatorAction,
    CalculatorObservation,
    env_name="calculator",
    max_concurrent_envs=MAX_SESSIONS,
)
