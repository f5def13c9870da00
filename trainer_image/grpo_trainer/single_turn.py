"""Single-turn sampling from the job's vLLM server(s), entering TRL through its public ``rollout_func`` hook.

Every source of a step's completions is one implementation of the same contract, TRL's rollout_func
(called on every rank with that rank's prompts, each repeated G times; it returns the prompt ids, the
completion ids vLLM sampled and their log-probabilities, plus extra fields the reward function receives):

* :class:`SingleTurnRollouts` (here): one completion per row, sampled by the job's vLLM server(s) through
  TRL's vLLM helper (served_generation.py: the weight transport, several replicas, riding out a replaced
  server); asynchronous jobs take the step's groups from the producer that sampled them ahead
  (async_generation.py);
* ``EpisodeRollouts`` (environment_rollouts.py): multi-turn episodes against the job's environment;
* ``make_rollout_func`` (client_rollouts.py): groups a client sampled and scored.

Only generation inside the training processes (a colocated vLLM engine, or transformers) is left to
TRL's own sampling, which the trainer does not override.
"""

from __future__ import annotations

from typing import Any


def tokenize_prompts(trainer: Any, prompts: list[Any]) -> list[list[int]]:
    """The prompts' token ids as TRL 1.16 tokenizes a text-only step: a conversation through the tokenizer's
    chat template (generation prompt added, the job's chatTemplateKwargs), plain text as it is.
    tests/trainer/test_trl_adapter.py checks that this still equals TRL's own tokenization."""
    from trl.data_utils import is_conversational

    tokenizer = trainer.processing_class
    if is_conversational({"prompt": prompts[0]}):
        tokenized = tokenizer.apply_chat_template(
            conversation=prompts,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **trainer.chat_template_kwargs,
        )
        return [list(map(int, ids)) for ids in tokenized["input_ids"]]
    return [list(map(int, ids)) for ids in tokenizer(text=prompts)["input_ids"]]


class SingleTurnRollouts:
    """TRL's rollout_func for single-turn jobs sampled by the job's vLLM server(s)."""

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        prompt_ids = tokenize_prompts(trainer, prompts)
        training = bool(getattr(trainer.model, "training", False))
        asynchronous = getattr(trainer, "grpo_async", None)
        if asynchronous is not None and training:
            # Sampled ahead (or now, when dropped), stamped with its policy version; TRL's weight push for
            # the step was made between the producer's requests (ProjectGRPOTrainer._generate).
            completion_ids, logprobs = asynchronous.generate_single_turn(
                prompt_ids, None, int(trainer.num_generations)
            )
        else:
            # Validation samples one answer per prompt, training G (each row is already one of the G).
            n = int(trainer.num_generations if training else trainer.num_generations_eval)
            _, completion_ids, top_logprobs, _ = trainer.vllm_generation.generate(
                prompts=prompt_ids, images=None, num_generations=n
            )
            # vLLM answers each token's top log-probabilities, the sampled token's first.
            logprobs = [[lp[0] for lp in seq] for seq in top_logprobs] if top_logprobs is not None else None
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}
