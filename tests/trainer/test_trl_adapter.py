"""The TRL and transformers internals the trainer depends on (grpo_trainer/trl_adapter.py) are still
there, with the parameters and results the trainer's code was written for. A TRL upgrade that changes
one fails here naming it, instead of as a wrong advantage or a lost checkpoint in a long run."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import pytest
from grpo_trainer import trl_adapter
from grpo_trainer.trainer import ProjectGRPOTrainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.trainer.grpo_trainer import GRPOTrainer

pytestmark = pytest.mark.trainer

UPGRADE = (
    "trainer_image/grpo_trainer/trl_adapter.py records what the trainer relies on; read the new TRL source "
    "of this item, adapt ProjectGRPOTrainer (trainer.py) and the adapter, then update the record"
)


def _parameters(function: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(name for name in inspect.signature(function).parameters if name != "self")


def _source(function: Callable[..., Any]) -> str:
    return textwrap.dedent(inspect.getsource(function))


@pytest.mark.parametrize("package", sorted(trl_adapter.WRITTEN_FOR))
def test_installed_versions_are_the_ones_the_adapter_was_checked_against(package: str) -> None:
    installed, recorded = version(package), trl_adapter.WRITTEN_FOR[package]
    assert installed == recorded, (
        f"{package} {installed} is installed; the trainer's use of its internals was checked against {recorded}. "
        f"Run tests/trainer/test_trl_adapter.py, then: {UPGRADE}, and set WRITTEN_FOR[{package!r}]"
    )


@pytest.mark.parametrize(
    "internal", [*trl_adapter.OVERRIDDEN, *trl_adapter.CALLED], ids=lambda internal: internal.name
)
def test_each_internal_method_still_exists_with_the_recorded_parameters(
    internal: trl_adapter.Internal,
) -> None:
    method = getattr(GRPOTrainer, internal.name, None)
    assert callable(method), f"GRPOTrainer.{internal.name} is gone ({internal.why}): {UPGRADE}"
    found = _parameters(method)
    assert found[: len(internal.parameters)] == internal.parameters, (
        f"GRPOTrainer.{internal.name} now takes {found}, the trainer was written for {internal.parameters} "
        f"({internal.why}): {UPGRADE}"
    )


def test_every_method_the_trainer_overrides_is_recorded() -> None:
    recorded = {internal.name for internal in trl_adapter.OVERRIDDEN}
    overridden = {
        name
        for name, value in vars(ProjectGRPOTrainer).items()
        if callable(value) and not name.startswith("__") and hasattr(GRPOTrainer, name)
    }
    assert overridden == recorded, (
        f"ProjectGRPOTrainer overrides {sorted(overridden - recorded)} without a record in trl_adapter.OVERRIDDEN, "
        f"or the record names {sorted(recorded - overridden)}, which it no longer overrides"
    )
    # Methods of the project's own must not collide with a TRL name by accident either: they are prefixed.
    for name in vars(ProjectGRPOTrainer):
        if name.startswith("grpo_"):
            assert not hasattr(GRPOTrainer, name), (
                f"TRL now defines {name}, which ProjectGRPOTrainer also uses"
            )


def test_grpo_trainer_still_sets_the_attributes_the_trainer_reads() -> None:
    init = _source(GRPOTrainer.__init__)
    for attribute in trl_adapter.INSTANCE_ATTRIBUTES:
        assert f"self.{attribute} =" in init, (
            f"GRPOTrainer.__init__ no longer sets self.{attribute}: {UPGRADE}"
        )


def test_vllm_generation_still_samples_with_the_parameters_sampled_ahead() -> None:
    """async_generation.sampling_params rebuilds the request VLLMGeneration.generate sends in server mode: each
    attribute it reads must still be set by VLLMGeneration and sent by generate, and no other one sent."""
    from trl.generation.vllm_generation import VLLMGeneration

    init, generate = _source(VLLMGeneration.__init__), _source(VLLMGeneration.generate)
    for attribute in trl_adapter.VLLM_SAMPLING_ATTRIBUTES:
        assert f"self.{attribute} =" in init and attribute in generate, (
            f"VLLMGeneration no longer samples with self.{attribute}: {UPGRADE}"
        )
    server = generate.split('if self.mode == "server":', 1)[1].split("with profiler:", 1)[0]
    sent = server.split("sampling_params = {", 1)[1].split("}", 1)[0]
    keys = {line.split(":", 1)[0].strip().strip('"') for line in sent.splitlines() if ":" in line}
    assert keys == {"n", "repetition_penalty", "temperature", "top_p", "top_k", "min_p", "max_tokens",
                    "logprobs", "structured_outputs_regex", "generation_kwargs"}, (
        f"VLLMGeneration.generate now sends {sorted(keys)}: {UPGRADE}"
    )  # fmt: skip


def test_generation_output_still_has_the_keys_the_trainer_replaces_and_pads() -> None:
    source = _source(GRPOTrainer._generate_and_score_completions)
    missing = [key for key in trl_adapter.GENERATION_OUTPUT_KEYS if f'"{key}"' not in source]
    assert not missing, f"GRPOTrainer._generate_and_score_completions no longer returns {missing}: {UPGRADE}"


def test_generate_still_returns_the_completion_texts_and_ids_at_the_recorded_indices() -> None:
    tree = ast.parse(_source(GRPOTrainer._generate))
    returns = [
        node.value for node in ast.walk(tree) if isinstance(node, ast.Return) and node.value is not None
    ]
    assert returns, f"GRPOTrainer._generate returns nothing: {UPGRADE}"
    for value in returns:
        assert isinstance(value, ast.Tuple), f"GRPOTrainer._generate no longer returns a tuple: {UPGRADE}"
        for index, name in (
            (trl_adapter.GENERATE_COMPLETIONS_INDEX, "completions"),
            (trl_adapter.GENERATE_COMPLETION_IDS_INDEX, "completion_ids"),
        ):
            element = value.elts[index]
            assert isinstance(element, ast.Name) and element.id == name, (
                f"element {index} of GRPOTrainer._generate's result is now {ast.unparse(element)}, not "
                f"{name}: {UPGRADE}"
            )


def test_checkpoints_are_still_staged_where_the_trainer_publishes_them_from() -> None:
    assert trl_adapter.STAGED_CHECKPOINT_PREFIX == PREFIX_CHECKPOINT_DIR, (
        f"transformers now writes checkpoints to {PREFIX_CHECKPOINT_DIR}-<step>: {UPGRADE}"
    )
    assert trl_adapter.staged_checkpoint_dir("/out", 7).as_posix() == f"/out/{PREFIX_CHECKPOINT_DIR}-7"


@pytest.mark.parametrize("exported", sorted(trl_adapter.LOG_KEYS))
def test_trl_or_transformers_still_logs_each_key_the_trainer_exports(exported: str) -> None:
    import transformers.trainer
    import trl.trainer.grpo_trainer

    key = trl_adapter.LOG_KEYS[exported]
    sources = [inspect.getsource(module) for module in (trl.trainer.grpo_trainer, transformers.trainer)]
    assert any(f'"{key}"' in source or f"'{key}'" in source for source in sources), (
        f"neither TRL's GRPOTrainer nor transformers' Trainer logs {key!r} any more, which the trainer exports "
        f"as {exported} (docs/metrics.md): {UPGRADE}"
    )


def test_rollout_func_is_still_called_with_the_recorded_contract() -> None:
    """Client-rollout jobs train through rollout_func (client_rollouts.py): TRL must still accept it, call it
    after its vLLM weight sync, require the recorded keys, accept logprobs None and forward other keys."""
    assert trl_adapter.ROLLOUT_FUNC_PARAMETER in inspect.signature(GRPOTrainer.__init__).parameters, (
        f"GRPOTrainer no longer takes {trl_adapter.ROLLOUT_FUNC_PARAMETER}: {UPGRADE}"
    )
    generate = _source(GRPOTrainer._generate)
    required = next(line for line in generate.splitlines() if "required_keys = {" in line)
    assert all(f'"{key}"' in required for key in trl_adapter.ROLLOUT_FUNC_KEYS), (
        f"rollout_func's required keys are now {required.strip()}: {UPGRADE}"
    )
    for method, fragments in trl_adapter.ROLLOUT_FUNC_CONTRACT.items():
        source = _source(getattr(GRPOTrainer, method))
        missing = [fragment for fragment in fragments if fragment not in source]
        assert not missing, f"GRPOTrainer.{method} no longer contains {missing}: {UPGRADE}"
    # The sync comes before the call: the client samples the weights the step starts from.
    assert generate.index("sync_weights()") < generate.index("self.rollout_func(prompts, self)")


def test_vllm_generation_still_holds_its_client_where_the_policy_server_reads_it() -> None:
    from trl.generation.vllm_generation import VLLMGeneration

    source = inspect.getsource(VLLMGeneration)
    assert f"self.{trl_adapter.VLLM_CLIENT_ATTRIBUTE} = VLLMClient(" in source, (
        f"VLLMGeneration no longer sets self.{trl_adapter.VLLM_CLIENT_ATTRIBUTE}: {UPGRADE}"
    )


def _vllm_generation_subclasses() -> dict[str, type[Any]]:
    from grpo_trainer import colocate, served_generation

    return {
        "server (served_generation.generation_class)": served_generation.generation_class(None, None, None),
        "colocate (colocate.generation_class)": colocate.generation_class(None),
    }


def test_every_vllm_generation_method_the_trainer_overrides_or_calls_is_recorded() -> None:
    """Both subclasses of TRL's VLLMGeneration override exactly the recorded methods, each still in TRL with
    the signature the override has, and the methods they call are still there."""
    from trl.generation.vllm_generation import VLLMGeneration

    recorded = set(trl_adapter.VLLM_GENERATION_OVERRIDDEN)
    for mode, cls in _vllm_generation_subclasses().items():
        overridden = {
            name
            for name, value in vars(cls).items()
            if callable(value) and not name.startswith("__") and hasattr(VLLMGeneration, name)
        }
        assert overridden == recorded, (
            f"the {mode} VLLMGeneration overrides {sorted(overridden - recorded)} without a record in "
            f"trl_adapter.VLLM_GENERATION_OVERRIDDEN, or the record names {sorted(recorded - overridden)}"
        )
    for name in (*trl_adapter.VLLM_GENERATION_OVERRIDDEN, *trl_adapter.VLLM_GENERATION_CALLED):
        method = getattr(VLLMGeneration, name, None)
        assert callable(method), f"VLLMGeneration.{name} is gone: {UPGRADE}"
        assert _parameters(method) == (), f"VLLMGeneration.{name} now takes {_parameters(method)}: {UPGRADE}"
    init = _source(VLLMGeneration.__init__)
    for attribute in trl_adapter.VLLM_GENERATION_ATTRIBUTES:
        assert f"self.{attribute} =" in init, (
            f"VLLMGeneration.__init__ no longer sets self.{attribute}: {UPGRADE}"
        )


def test_vllm_generation_still_builds_and_syncs_the_colocated_engine_as_recorded() -> None:
    """colocate.generation_class reads the engine TRL builds and replaces TRL's colocate weight sync with a
    reload through the same model runner: the attributes, the path and TRL's own sync must be as recorded."""
    from trl.generation.vllm_generation import VLLMGeneration

    source = inspect.getsource(VLLMGeneration)
    for attribute in trl_adapter.VLLM_COLOCATE_ATTRIBUTES:
        assert f"self.{attribute} =" in source, f"VLLMGeneration no longer sets self.{attribute}: {UPGRADE}"
    sync = _source(VLLMGeneration.sync_weights)
    colocated = sync.split('elif self.mode == "colocate":', 1)[-1]
    missing = [fragment for fragment in trl_adapter.VLLM_COLOCATE_SYNC_CONTRACT if fragment not in colocated]
    assert not missing, f"VLLMGeneration.sync_weights (colocate) no longer contains {missing}: {UPGRADE}"
    init_vllm = _source(VLLMGeneration._init_vllm)
    assert f"self.llm = {trl_adapter.VLLM_ENGINE_NAME}(" in init_vllm, (
        f"VLLMGeneration._init_vllm no longer builds its engine with {trl_adapter.VLLM_ENGINE_NAME}(: {UPGRADE}"
    )
    assert "dtype=" not in init_vllm, (
        f"VLLMGeneration._init_vllm now passes the engine a dtype itself: {UPGRADE}"
    )
    module = importlib.import_module(trl_adapter.VLLM_ENGINE_MODULE)
    assert module is inspect.getmodule(VLLMGeneration), f"VLLMGeneration moved: {UPGRADE}"
    path = ".".join(trl_adapter.VLLM_COLOCATE_RUNNER_PATH)
    assert f"self.llm.{path}." in colocated, f"TRL no longer reaches vLLM's model runner as {path}: {UPGRADE}"


def test_accelerate_still_makes_an_fsdp_state_only_the_way_allow_fsdp_on_cpu_repeats() -> None:
    """allow_fsdp_on_cpu repeats, for a CPU process group, what AcceleratorState.__init__ does with an FSDP
    plugin on an accelerator one; a change there (an upgrade of accelerate) must be re-read."""
    from accelerate.state import AcceleratorState

    source = inspect.getsource(AcceleratorState.__init__)
    missing = [f for f in trl_adapter.ACCELERATE_FSDP_STATE_CONTRACT if f not in source]
    assert not missing, f"accelerate's AcceleratorState.__init__ no longer contains {missing}: {UPGRADE}"
    assert version("accelerate") == "1.15.0", f"accelerate {version('accelerate')}: {UPGRADE}"


def test_single_turn_rollouts_tokenize_prompts_as_trl_does(tiny_model: Any) -> None:
    """Single-turn jobs sampled by vLLM servers enter TRL through rollout_func (single_turn.py), which
    tokenizes the prompts itself: the ids must be the ones TRL's own sampling would send, for plain text
    and for conversations (chat template, generation prompt, the job's chatTemplateKwargs)."""
    from types import SimpleNamespace

    from grpo_trainer.single_turn import tokenize_prompts
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking == 'false' %}/no_think{% endif %}"
        "{% endif %}"
    )
    trainer = SimpleNamespace(
        processing_class=tokenizer,
        chat_template_kwargs={"enable_thinking": "false"},
        chat_template=None,
        tools=None,
        environment_factories=None,
        _is_vlm=False,
    )
    plain = ["q1a: ", "what is 2 + 2?"]
    chats = [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1a:"}],
        [{"role": "user", "content": "what is 2 + 2?"}],
    ]
    for prompts in (plain, chats):
        tokenized = GRPOTrainer._tokenize_prompts(trainer, prompts)  # type: ignore[arg-type]
        trl_ids = [list(map(int, ids)) for ids in tokenized[0]]
        assert tokenize_prompts(trainer, prompts) == trl_ids, (
            f"single_turn.tokenize_prompts no longer matches GRPOTrainer._tokenize_prompts: {UPGRADE}"
        )
    assert (
        tokenize_prompts(trainer, chats)[0]
        != tokenize_prompts(SimpleNamespace(processing_class=tokenizer, chat_template_kwargs={}), chats)[0]
    ), "the chat template kwargs must reach the template"
