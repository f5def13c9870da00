"""The advantage definition of docs/concepts.md on the function the trainer calls (see also
tests/trainer/test_advantages_training_path.py, which goes through GRPOTrainer itself)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="the advantage code uses torch; install the [trainer] extra")

from grpo_trainer.advantages import compute_advantages  # noqa: E402

SEED_REWARDS = [0.9, 0.6, 0.3, 0.2]
SEED_ADVANTAGES = [1.4606, 0.3651, -0.7303, -1.0954]


def test_seed_worked_example_to_four_decimals() -> None:
    result = compute_advantages(torch.tensor(SEED_REWARDS), group_size=4)
    assert [round(a, 4) for a in result.advantages.tolist()] == SEED_ADVANTAGES
    assert math.isclose(float(result.advantages.sum()), 0.0, abs_tol=1e-6)
    assert math.isclose(float((result.advantages**2).sum()), 4.0, rel_tol=1e-6)
    assert math.isclose(float(result.group_std[0]), math.sqrt(0.075), rel_tol=1e-6)


def test_population_not_sample_std() -> None:
    # Binary rewards with G=2: population sigma is 0.5, so advantages are exactly +-1 (TRL's sample std
    # would give +-0.7071).
    result = compute_advantages(torch.tensor([1.0, 0.0]), group_size=2)
    assert [round(a, 6) for a in result.advantages.tolist()] == [1.0, -1.0]


@pytest.mark.parametrize("value", [0.3, 0.1, 1.0 / 3.0, -1.0, 0.0, 123.456])
@pytest.mark.parametrize("group_size", [2, 3, 6, 8, 16])
def test_tied_group_is_exactly_zero(value: float, group_size: int) -> None:
    result = compute_advantages(torch.full((group_size,), value), group_size=group_size)
    assert result.advantages.tolist() == [0.0] * group_size
    assert result.num_tied == 1
    assert result.zero_std_group_ratio == 1.0


def test_several_groups_are_independent_and_ties_counted() -> None:
    rewards = torch.tensor(SEED_REWARDS + [0.5] * 4 + [1.0, 0.0, 1.0, 0.0])
    result = compute_advantages(rewards, group_size=4)
    adv = result.advantages.tolist()
    assert [round(a, 4) for a in adv[:4]] == SEED_ADVANTAGES
    assert adv[4:8] == [0.0] * 4
    assert [round(a, 4) for a in adv[8:]] == [1.0, -1.0, 1.0, -1.0]
    assert result.tied_groups.tolist() == [False, True, False]
    assert result.zero_std_group_ratio == pytest.approx(1 / 3)


def test_metric_errors_are_left_out_of_the_group_statistics() -> None:
    nan = float("nan")
    # The scored rewards are the seed example; the error in the middle must not change them.
    rewards = torch.tensor([0.9, 0.6, nan, 0.3, 0.2, nan])
    result = compute_advantages(rewards, group_size=6)
    adv = result.advantages.tolist()
    assert adv[2] == 0.0 and adv[5] == 0.0
    assert [round(a, 4) for a in (adv[0], adv[1], adv[3], adv[4])] == SEED_ADVANTAGES
    assert math.isclose(float(result.group_mean[0]), 0.5, rel_tol=1e-6)


def test_group_of_only_errors_and_single_survivor() -> None:
    nan = float("nan")
    result = compute_advantages(torch.tensor([nan, nan, nan, 0.7]), group_size=2)
    assert result.advantages.tolist() == [0.0] * 4
    assert result.scored_groups.tolist() == [False, True]
    # a single scored answer has nothing to be compared with: no diversity
    assert result.tied_groups.tolist() == [False, True]
    assert result.zero_std_group_ratio == 1.0


def test_scale_none_skips_the_division() -> None:
    result = compute_advantages(torch.tensor(SEED_REWARDS), group_size=4, scale_rewards="none")
    assert [round(a, 6) for a in result.advantages.tolist()] == [0.4, 0.1, -0.2, -0.3]


def test_scale_batch_uses_population_std_of_the_whole_batch() -> None:
    rewards = [0.9, 0.6, 0.3, 0.2, 1.0, 0.0, 1.0, 0.0]
    result = compute_advantages(torch.tensor(rewards), group_size=4, scale_rewards="batch")
    mean_all = sum(rewards) / len(rewards)
    batch_std = math.sqrt(sum((r - mean_all) ** 2 for r in rewards) / len(rewards))
    expected = [(r - 0.5) / batch_std for r in rewards]
    assert result.advantages.tolist() == pytest.approx(expected, abs=1e-6)


def test_scale_batch_still_zeroes_tied_groups() -> None:
    result = compute_advantages(torch.tensor([0.3] * 4 + SEED_REWARDS), group_size=4, scale_rewards="batch")
    assert result.advantages.tolist()[:4] == [0.0] * 4


@pytest.mark.parametrize(
    ("rewards", "group_size", "message"),
    [([1.0, 2.0], 1, "at least 2"), ([1.0, 2.0, 3.0], 2, "multiple of group_size")],
)
def test_invalid_inputs_explain_themselves(rewards: list[float], group_size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compute_advantages(torch.tensor(rewards), group_size=group_size)


def test_unknown_scale_rejected() -> None:
    with pytest.raises(ValueError, match="scale_rewards"):
        compute_advantages(torch.tensor([1.0, 0.0]), group_size=2, scale_rewards="std")  # type: ignore[arg-type]


# -- no finite reward overflows (a client once sent 1e308: the sum overflowed and the job looped on NaN) --

HUGE = 1.7e308  # close to float64's largest finite value


@pytest.mark.parametrize("scale", ["group", "batch"])
@pytest.mark.parametrize("factor", [1e307, 1e150, 1e3])
def test_advantages_are_scale_invariant_up_to_the_largest_float(scale: str, factor: float) -> None:
    rewards = torch.tensor([r * factor for r in SEED_REWARDS], dtype=torch.float64)
    result = compute_advantages(rewards, group_size=4, scale_rewards=scale, max_abs_reward=None)  # type: ignore[arg-type]
    assert [round(a, 4) for a in result.advantages.tolist()] == SEED_ADVANTAGES
    assert math.isclose(float(result.group_std[0]), math.sqrt(0.075) * factor, rel_tol=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_mixed_huge_and_small_rewards_give_the_defined_advantages(scale: str) -> None:
    rewards = torch.tensor([HUGE, -HUGE, 1e-300, 0.0, HUGE, HUGE, HUGE, HUGE], dtype=torch.float64)
    result = compute_advantages(rewards, group_size=4, scale_rewards=scale, max_abs_reward=None)  # type: ignore[arg-type]
    adv = result.advantages.tolist()
    assert all(math.isfinite(a) for a in adv)
    # Population sigma of (1, -1, 0, 0) x HUGE is HUGE / sqrt(2); the all-equal huge group is exactly 0.
    if scale == "group":
        assert [round(a, 4) for a in adv[:4]] == [1.4142, -1.4142, 0.0, 0.0]
    assert adv[4:] == [0.0] * 4
    assert result.tied_groups.tolist() == [False, True]
    assert math.isfinite(float(result.group_mean[0])) and math.isfinite(float(result.group_std[0]))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize(
    "poison",
    [
        [1e308, 1e308, 0.0, 0.0],  # the attack: the group's sum overflows
        [HUGE, -HUGE, 0.5, 0.1],  # r - mu overflows
        [float("inf"), 0.0, 0.5, 0.1],
        [1e6 * (1 + 1e-9), 0.0, 0.0, 0.0],  # just past the bound
    ],
)
def test_a_group_with_a_reward_beyond_the_bound_is_rejected_and_the_others_keep_theirs(
    scale: str, poison: list[float]
) -> None:
    rewards = torch.tensor(poison + SEED_REWARDS, dtype=torch.float64)
    result = compute_advantages(rewards, group_size=4, scale_rewards=scale)  # type: ignore[arg-type]
    adv = result.advantages.tolist()
    assert all(math.isfinite(a) for a in adv)
    assert adv[:4] == [0.0] * 4
    assert result.rejected_groups.tolist() == [True, False] and result.num_rejected == 1
    assert result.scored_groups.tolist() == [False, True]
    alone = compute_advantages(torch.tensor(SEED_REWARDS), group_size=4, scale_rewards=scale)  # type: ignore[arg-type]
    assert adv[4:] == pytest.approx(alone.advantages.tolist(), abs=1e-6)


def test_scale_none_stays_within_twice_the_bound() -> None:
    bound = 1e6  # r - mu of rewards within +-bound is within +-2 x bound
    rewards = torch.tensor([bound, -bound, -bound, -bound, bound, bound, 0.0, 0.0], dtype=torch.float64)
    result = compute_advantages(rewards, group_size=4, scale_rewards="none", max_abs_reward=bound)
    assert result.advantages.tolist() == [1.5e6, -0.5e6, -0.5e6, -0.5e6, 0.5e6, 0.5e6, -0.5e6, -0.5e6]
    assert result.num_rejected == 0


def test_scale_none_without_a_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="'none' needs a reward bound"):
        compute_advantages(
            torch.tensor(SEED_REWARDS), group_size=4, scale_rewards="none", max_abs_reward=None
        )
    with pytest.raises(ValueError, match="max_abs_reward must be in"):
        compute_advantages(torch.tensor(SEED_REWARDS), group_size=4, max_abs_reward=1e300)


def test_the_default_bound_is_the_metric_paths() -> None:
    from grpo_operator.api.trainer_config import MetricClientConfig
    from grpo_trainer.advantages import DEFAULT_MAX_ABS_REWARD
    from grpo_trainer.metric_client import DEFAULT_MAX_ABS_REWARD as METRIC_DEFAULT

    assert DEFAULT_MAX_ABS_REWARD == METRIC_DEFAULT == MetricClientConfig(url="http://m").max_abs_reward
