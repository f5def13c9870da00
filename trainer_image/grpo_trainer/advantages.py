"""Group-relative advantages exactly as docs/concepts.md defines them (population sigma).

TRL 1.16 divides by the Bessel-corrected (sample) standard deviation plus 1e-4. This project uses the
population standard deviation, gives *exactly* zero advantage to groups whose rewards are all equal, and
leaves metric-service errors (NaN rewards) out of the group statistics. ``ProjectGRPOTrainer``
(trainer.py) calls :func:`compute_advantages` on the gathered rewards of every generation round, so the
function tested here is the one training uses.

No finite input can make an advantage overflow: the statistics are computed on rewards divided by their
largest magnitude (the group's, or the batch's for ``batch``), which the division by sigma cancels exactly,
and every reward must lie within ``max_abs_reward`` (the metric path's spec.metric.maxAbsReward, the same
1e6 the gateway enforces on client rewards). A group holding a reward beyond that bound (or an infinite
one) came from a scorer that broke the contract: the whole group is *rejected* -- advantage 0 for all of its
answers, left out of the batch statistics and reported in ``rejected_groups`` -- so that ``none``'s
``r - mu`` stays within 2 x the bound, and one absurd reward cannot swamp the other groups of a ``batch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

ScaleRewards = Literal["group", "batch", "none"]

# Added to sigma only to avoid a division by zero in groups that are *not* tied but whose spread is tiny;
# tied groups never reach the division (they are zeroed explicitly), so eps cannot leave a residue there.
ADVANTAGE_EPS = 1e-8
# Rewards closer than this are treated as equal. Metric services return deterministic floats, so ties are
# normally bit-identical; the tolerance only absorbs rounding from weighted sums of several rewards.
TIE_TOLERANCE = 1e-6
# Largest |reward| a trainer accepts unless told otherwise: metric_client.DEFAULT_MAX_ABS_REWARD, the API's
# spec.metric.maxAbsReward default and the gateway's client bound (tests/unit/test_advantages.py checks).
DEFAULT_MAX_ABS_REWARD = 1e6
# Advantages are returned as float32; with ``none`` they reach 2 x the bound, which must stay representable.
MAX_REWARD_BOUND = float(torch.finfo(torch.float32).max) / 4


@dataclass(frozen=True)
class AdvantageResult:
    """Advantages for a flat batch of ``num_groups * group_size`` rewards, plus the group bookkeeping."""

    advantages: torch.Tensor  # [N] float32; 0 for errors and tied groups
    group_mean: torch.Tensor  # [num_groups] float64; NaN for groups with no scored reward
    group_std: torch.Tensor  # [num_groups] float64; population std; NaN for groups with no scored reward
    tied_groups: torch.Tensor  # [num_groups] bool; all scored rewards equal (incl. a single scored reward)
    scored_groups: torch.Tensor  # [num_groups] bool; at least one scored reward, and not rejected
    # [num_groups] bool; a reward beyond max_abs_reward or infinite: the whole group has advantage 0
    rejected_groups: torch.Tensor

    @property
    def num_groups(self) -> int:
        return int(self.tied_groups.numel())

    @property
    def num_tied(self) -> int:
        return int(self.tied_groups.sum().item())

    @property
    def num_rejected(self) -> int:
        return int(self.rejected_groups.sum().item())

    @property
    def zero_std_group_ratio(self) -> float:
        """Tied ("no diversity") groups over groups that had at least one scored reward."""
        scored = int(self.scored_groups.sum().item())
        return self.num_tied / scored if scored else 0.0


def compute_advantages(
    rewards: torch.Tensor,
    group_size: int,
    scale_rewards: ScaleRewards = "group",
    eps: float = ADVANTAGE_EPS,
    max_abs_reward: float | None = DEFAULT_MAX_ABS_REWARD,
) -> AdvantageResult:
    """Turn rewards into advantages, group by group.

    ``rewards`` is a flat tensor whose consecutive runs of ``group_size`` entries are the answers to one
    prompt (TRL's RepeatSampler order). NaN marks a metric-service error: that answer is left out of its
    group's mean and std and gets advantage 0. A group with a reward beyond ``max_abs_reward`` (or an
    infinite one) is rejected whole (module docstring); ``None`` lifts the bound, which only ``group`` and
    ``batch`` can do without (their advantages are scale invariant).

    * ``group``: A_j = (r_j - mu_group) / (sigma_group + eps), sigma the population std of the group.
    * ``batch``: the mean is still per group, sigma is the population std of all scored rewards.
    * ``none``: A_j = r_j - mu_group (Dr. GRPO).
    """
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 to compare answers, got {group_size}")
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"expected a flat tensor whose length is a multiple of group_size={group_size}, "
            f"got shape {tuple(rewards.shape)}"
        )
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    if max_abs_reward is None and scale_rewards == "none":
        raise ValueError(
            "scale_rewards 'none' needs a reward bound (max_abs_reward): without a divisor, r - mu of finite "
            "rewards can overflow"
        )
    if max_abs_reward is not None and not 0 < max_abs_reward <= MAX_REWARD_BOUND:
        raise ValueError(
            f"max_abs_reward must be in (0, {MAX_REWARD_BOUND:g}] so that advantages stay finite in float32, "
            f"got {max_abs_reward!r}"
        )

    # float64 keeps the mean of values like 0.3 exact enough that the 4-decimal contract holds for any G.
    r = rewards.detach().to(dtype=torch.float64, device="cpu").view(-1, group_size)
    scored = ~torch.isnan(r)
    out_of_bound = torch.isinf(r)
    if max_abs_reward is not None:
        out_of_bound |= scored & (r.abs() > max_abs_reward)
    rejected = out_of_bound.any(dim=1)
    valid = scored & ~rejected.unsqueeze(1)
    count = valid.sum(dim=1)
    scored_groups = count > 0
    safe_count = count.clamp(min=1).to(torch.float64)
    zeros = torch.zeros_like(r)
    magnitude = torch.where(valid, r.abs(), zeros)

    def centred(scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(r - mu) / scale per answer and mu / scale per group, for rewards divided by ``scale`` (per
        group, [G, 1], or per batch, [1, 1]): every value is within [-2, 2], so nothing overflows."""
        scaled = torch.where(valid, r / scale, zeros)
        mean = scaled.sum(dim=1) / safe_count
        return scaled, torch.where(valid, scaled - mean.unsqueeze(1), zeros), mean

    group_scale = magnitude.amax(dim=1, keepdim=True)
    group_scale = torch.where(group_scale > 0, group_scale, torch.ones_like(group_scale))
    _, centered, mean = centred(group_scale)
    std = torch.sqrt((centered**2).sum(dim=1) / safe_count)
    scale = group_scale.squeeze(1)

    big = torch.finfo(torch.float64).max
    r_max = torch.where(valid, r, torch.full_like(r, -big)).amax(dim=1)
    r_min = torch.where(valid, r, torch.full_like(r, big)).amin(dim=1)
    # Both are finite, so their difference is at worst +inf (not tied), never NaN.
    tied = scored_groups & ((r_max - r_min) <= TIE_TOLERANCE)

    if scale_rewards == "group":
        # (r - mu) / (sigma + eps) == c / (sigma_c + eps / s) with c = (r - mu) / s: s cancels exactly.
        adv = centered / (std + eps / scale).unsqueeze(1)
    elif scale_rewards == "batch":
        batch_scale = magnitude.max() if bool(valid.any()) else torch.tensor(0.0, dtype=torch.float64)
        batch_scale = batch_scale if batch_scale > 0 else torch.tensor(1.0, dtype=torch.float64)
        scaled, batch_centered, _ = centred(batch_scale.view(1, 1))
        all_valid = scaled[valid]
        batch_std = (
            torch.sqrt(((all_valid - all_valid.mean()) ** 2).mean())
            if all_valid.numel()
            else torch.tensor(0.0, dtype=torch.float64)
        )
        adv = batch_centered / (batch_std + eps / batch_scale)
    else:
        # Every reward is within the bound here, so |r - mu| <= 2 x bound.
        adv = centered * scale.unsqueeze(1)

    adv = torch.where(valid & ~tied.unsqueeze(1), adv, zeros)
    nan = torch.full_like(mean, float("nan"))
    return AdvantageResult(
        advantages=adv.reshape(-1).to(torch.float32),
        group_mean=torch.where(scored_groups, mean * scale, nan),
        group_std=torch.where(scored_groups, std * scale, nan),
        tied_groups=tied,
        scored_groups=scored_groups,
        rejected_groups=rejected,
    )
