"""Multi-turn episodes against the job's environment, trained token for token.

An episode starts from a dataset row: the environment is reset with the row's columns, and the prompt is the
row's prompt (plus the reset's observation, when it has text). Then, turn by turn, the model samples from the
exact token ids of everything so far (through the job's vLLM server, which returns the ids it sampled and
their log-probabilities), the turn becomes an action, the environment steps, and its observation joins the
context as the next message. Only what the chat template puts between the model's turn and the next
generation prompt is tokenised here (the glue: the end of the assistant turn, the observation's message, the
next assistant header), and those tokens are appended to the context as they are fed to vLLM: the sequence
the loss sees is the sequence the model was sampled on, so no re-tokenisation of a transcript can drift.

The completion TRL trains is every model turn and every glue in order; ``env_mask`` (TRL's rollout field)
is 1 on the model's tokens and 0 on the glue's, so the loss covers exactly the sampled tokens, with their
sampling log-probabilities for the importance-sampling correction.

How an episode ends decides its reward:

- ``done``: the environment ended it; the reward is the final step's (``Final``) or the sum (``Sum``).
- ``truncated``: ``maxTurns`` or the token budget (grpo.maxCompletionLength) ran out first; the reward is
  what the environment gave so far, or grpo.formatFailureScore when it gave none.

With a metric beside the environment (``reward_optional``), an environment that gives no reward adds 0
instead (the metric scores the final answer, environment_rollouts.py), and a done episode without one is
not a failure.
- ``format_failure``: the model's turn could not be made into an action (a ToolCall episode without a
  well-formed tool call): grpo.formatFailureScore, counted apart.
- ``environment_error``: the environment failed (an error, a timeout, a broken session, an answer outside the
  protocol, a done episode without a reward): no reward at all. The episode is left out of its group's
  statistics with advantage 0 and counted against spec.environment.errorBudget.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from grpo_operator.api.environment import EnvironmentClientConfig

from grpo_trainer.environment_client import EnvironmentFailure, EnvironmentSession, Observation, short

Outcome = Literal["done", "truncated", "format_failure", "environment_error"]
# A stand-in for the assistant's text when the template is rendered to find the glue after a turn.
SENTINEL = "\u2063GRPO-TURN\u2063"
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
CUT_MARK = " [observation cut]"


class TurnSampler(Protocol):
    def __call__(self, context_ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
        """The token ids sampled after ``context_ids`` (the end token included when the model emitted one)
        and their sampling log-probabilities."""
        ...


@dataclass
class Turn:
    """One model turn and what followed it."""

    ids: list[int]
    logprobs: list[float]
    text: str
    action: dict[str, Any] | None = None
    observation: str | None = None
    glue_ids: list[int] = field(default_factory=list)
    reward: float | None = None
    step_seconds: float | None = None


@dataclass
class Episode:
    """An episode as TRL trains it, and how it went."""

    prompt_ids: list[int]
    prompt_text: str
    turns: list[Turn] = field(default_factory=list)
    outcome: Outcome = "done"
    reward: float | None = None
    reason: str = ""
    reset_seconds: float | None = None
    # The policy version (optimizer steps) of the weights vLLM sampled every turn with.
    policy_version: int | None = None

    @property
    def completion_ids(self) -> list[int]:
        ids: list[int] = []
        for turn in self.turns:
            ids += turn.ids + turn.glue_ids
        return ids

    @property
    def env_mask(self) -> list[int]:
        mask: list[int] = []
        for turn in self.turns:
            mask += [1] * len(turn.ids) + [0] * len(turn.glue_ids)
        return mask

    @property
    def logprobs(self) -> list[float]:
        out: list[float] = []
        for turn in self.turns:
            # The glue was not sampled: NaN, which TRL's importance-sampling correction treats as ratio 1 (and
            # the mask leaves out of the loss anyway).
            out += list(turn.logprobs) + [math.nan] * len(turn.glue_ids)
        return out

    @property
    def model_tokens(self) -> int:
        return sum(len(t.ids) for t in self.turns)

    @property
    def step_seconds(self) -> list[float]:
        return [t.step_seconds for t in self.turns if t.step_seconds is not None]

    @property
    def final_answer(self) -> str:
        """The model's last turn: what a metric beside the environment scores."""
        spoken = [t for t in self.turns if t.ids]
        return spoken[-1].text if spoken else ""

    def text(self) -> str:
        """The episode after its prompt, as the model saw it: each turn, each observation."""
        parts: list[str] = []
        for turn in self.turns:
            parts.append(turn.text)
            if turn.observation is not None:
                parts.append(f"[observation] {turn.observation}")
        return "\n".join(parts)


class ChatGlue:
    """Token ids of a prompt and of the glue after each turn, rendered by the model's chat template (or, for a
    model without one, plain text with blank lines between turns)."""

    def __init__(self, tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        eos = tokenizer.eos_token_id
        self.end_ids = {int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None}

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, messages: Sequence[Mapping[str, Any]], generation_prompt: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                list(messages),
                tokenize=False,
                add_generation_prompt=generation_prompt,
                **self.template_kwargs,
            )
        )

    def prompt_text(self, prompt: Any) -> str:
        if isinstance(prompt, str):
            return prompt
        if self.chat:
            return self.render(prompt, True)
        return "\n\n".join(str(m.get("content", "")) for m in prompt) + "\n\n"

    def messages(self, prompt: Any) -> list[dict[str, Any]]:
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        return [dict(m) for m in prompt]

    def glue(self, history: list[dict[str, Any]], turn_ids: list[int], observation: dict[str, Any]) -> str:
        """The text between the model's turn (``turn_ids``, after ``history``) and the next generation prompt,
        with ``observation`` as the message in between."""
        if not self.chat:
            return f"\n\n{observation['content']}\n\n"
        full = self.render([*history, {"role": "assistant", "content": SENTINEL}, observation], True)
        at = full.rfind(SENTINEL)
        if at < 0:
            raise ValueError("the chat template dropped the assistant's turn; it cannot be used for episodes")
        tail = full[at + len(SENTINEL) :]
        if turn_ids and turn_ids[-1] in self.end_ids:
            # The model ended its turn itself: the template's turn end starts with that token, already in the
            # sequence as sampled.
            end_text = self.tokenizer.decode([turn_ids[-1]])
            if tail.startswith(end_text):
                tail = tail[len(end_text) :]
        return tail


def parse_action(config: EnvironmentClientConfig, text: str) -> dict[str, Any]:
    """The action for a turn's text; ValueError (the model's format failure) when it holds none."""
    if config.action_format == "Text":
        return {config.action_field: text}
    match = TOOL_CALL_RE.search(text)
    if match is None:
        raise ValueError("the turn holds no <tool_call>...</tool_call> block")
    try:
        call = json.loads(match.group(1))
    except ValueError as exc:
        raise ValueError(f"the tool call is not JSON ({exc})") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise ValueError('the tool call has no "name"')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise ValueError("the tool call's arguments are not a JSON object") from None
    if not isinstance(arguments, dict):
        raise ValueError("the tool call's arguments are not a JSON object")
    return {"type": "call_tool", "tool_name": call["name"], "arguments": arguments}


def observation_text(config: EnvironmentClientConfig, observation: Mapping[str, Any]) -> str:
    if config.observation_field is None:
        return json.dumps(observation, ensure_ascii=False, default=str)
    if config.observation_field not in observation:
        raise EnvironmentFailure(
            f"the observation has no field {config.observation_field!r} (spec.environment.observationField); "
            f"it has {sorted(observation)[:20]}"
        )
    value = observation[config.observation_field]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def json_safe(row: Mapping[str, Any]) -> dict[str, Any]:
    """A dataset row as reset data: JSON round-tripped (values JSON cannot hold become their text)."""
    out: dict[str, Any] = json.loads(json.dumps(dict(row), default=str))
    return out


@dataclass
class EpisodeRunner:
    """Runs episodes: ``sample`` is the turn sampler (the job's vLLM), ``session`` opens an environment
    session, ``budget`` is the episode's token budget (grpo.maxCompletionLength)."""

    config: EnvironmentClientConfig
    glue: ChatGlue
    sample: TurnSampler
    budget: int
    format_failure_score: float
    session: Callable[[], EnvironmentSession] | None = None
    # A metric scores the final answer too: the environment's reward may be absent (it then adds 0).
    reward_optional: bool = False

    def open_session(self) -> EnvironmentSession:
        if self.session is not None:
            return self.session()
        return EnvironmentSession(self.config.url, self.config.timeout_seconds, self.config.max_message_bytes)

    def cut(self, text: str) -> str:
        ids = self.glue.ids(text)
        limit = self.config.max_observation_tokens
        if len(ids) <= limit:
            return text
        return str(self.glue.tokenizer.decode(ids[:limit])) + CUT_MARK

    def run(self, prompt: Any, row: Mapping[str, Any]) -> Episode:
        """One episode; never raises for what the environment or the model does."""
        history = self.glue.messages(prompt)
        episode = Episode(prompt_ids=[], prompt_text="")
        try:
            with self.open_session() as env:
                first = env.reset(json_safe({k: v for k, v in row.items() if k != "prompt"}))
                episode.reset_seconds = first.seconds
                opening = observation_text(self.config, first.observation) if first.observation else ""
                if opening.strip():
                    history.append({"role": "user", "content": self.cut(opening)})
                    prompt = (
                        history if self.glue.chat or not isinstance(prompt, str) else f"{prompt}\n\n{opening}"
                    )
                episode.prompt_text = self.glue.prompt_text(prompt)
                episode.prompt_ids = self.glue.ids(episode.prompt_text)
                self._turns(env, episode, history, first)
        except EnvironmentFailure as exc:
            episode.outcome, episode.reward, episode.reason = "environment_error", None, str(exc)
        if not episode.prompt_ids:
            episode.prompt_text = self.glue.prompt_text(prompt)
            episode.prompt_ids = self.glue.ids(episode.prompt_text)
        if not episode.turns:
            # TRL needs a token per completion; one the loss never sees (mask 0), in a failed episode.
            end = min(self.glue.end_ids) if self.glue.end_ids else 0
            episode.turns.append(Turn(ids=[], logprobs=[], text="", glue_ids=[end]))
        return episode

    def _turns(
        self, env: EnvironmentSession, episode: Episode, history: list[dict[str, Any]], first: Observation
    ) -> None:
        rewards: list[float] = [first.reward] if first.reward is not None else []
        context = list(episode.prompt_ids)
        done = first.done
        for _ in range(self.config.max_turns):
            if done:
                break
            left = self.budget - len(episode.completion_ids)
            if left <= 0:
                break
            cap = min(left, self.config.max_turn_tokens or left)
            ids, logprobs = self.sample(context + episode.completion_ids, cap)
            text = str(self.glue.tokenizer.decode(ids, skip_special_tokens=True))
            turn = Turn(ids=list(ids), logprobs=list(logprobs), text=text)
            episode.turns.append(turn)
            try:
                turn.action = parse_action(self.config, text)
            except ValueError as exc:
                episode.outcome, episode.reward = "format_failure", self.format_failure_score
                episode.reason = f"turn {len(episode.turns)}: {exc}"
                return
            result = env.step(turn.action)
            turn.step_seconds, turn.reward, done = result.seconds, result.reward, result.done
            if result.reward is not None:
                rewards.append(result.reward)
            if done:
                break
            turn.observation = self.cut(observation_text(self.config, result.observation))
            message = {"role": self.config.observation_role, "content": turn.observation}
            glue_ids = self.glue.ids(self.glue.glue(history, turn.ids, message))
            if len(episode.completion_ids) + len(glue_ids) >= self.budget:
                turn.observation = None
                break
            turn.glue_ids = glue_ids
            history += [{"role": "assistant", "content": text}, message]
        if done:
            final = episode.turns[-1].reward if episode.turns else first.reward
            reward = final if self.config.reward == "Final" else (sum(rewards) if rewards else None)
            if reward is None and self.reward_optional:
                reward = 0.0
            if reward is None:
                raise EnvironmentFailure("the environment ended the episode without a reward")
            episode.outcome, episode.reward = "done", reward
            return
        if episode.turns and episode.turns[-1].glue_ids:
            # The model never answered the last observation: its tokens would only cost the budget.
            episode.turns[-1].glue_ids = []
        given = [t.reward for t in episode.turns if t.reward is not None]
        episode.outcome = "truncated"
        nothing = 0.0 if self.reward_optional else self.format_failure_score
        if self.config.reward == "Final":
            episode.reward = given[-1] if given else nothing
        else:
            episode.reward = sum(rewards) if rewards else nothing
        episode.reason = f"no end after {len(episode.turns)} turns and {len(episode.completion_ids)} tokens"


def run_episodes(
    runner: EpisodeRunner, prompts: Sequence[Any], rows: Sequence[Mapping[str, Any]], concurrency: int
) -> tuple[list[Episode], float]:
    """Every prompt's episode, ``concurrency`` at a time, in order; and the wall time they took."""
    started = time.monotonic()
    with ThreadPoolExecutor(
        max_workers=max(1, min(concurrency, len(prompts))), thread_name_prefix="episode"
    ) as pool:
        episodes = list(pool.map(runner.run, prompts, rows))
    return episodes, time.monotonic() - started


def describe_failures(episodes: Sequence[Episode]) -> str:
    failed = [e for e in episodes if e.outcome == "environment_error"]
    if not failed:
        return ""
    return f"{len(failed)} of {len(episodes)} episodes failed on the environment's side, e.g.: {short(failed[0].reason)}"
