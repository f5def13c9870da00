"""Group-relative advantages exactly as docs/concepts.md defines them (population sigma).

TRL 1.16 divides by the Bessel-corrected (sample) standard deviation plus 1e-4. This project uses the
population standard deviation, gives *exactly* zero advantage to groups whose rewards are all equal, and
leaves metric-service errors (NaN rewards) out of the group statistics. ``ProjectGRPOTrainer``
(trainer.py) calls :func:`compute_advantages` on the gathered rewards of every generation round, so the
function tested here is the one training uses.
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


@dataclass(frozen=True)
class AdvantageResult:
    """Advantages for a flat batch of ``num_groups * group_size`` rewards, plus the group bookkeeping."""

    advantages: torch.Tensor  # [N] float32; 0 for errors and tied groups
    group_mean: torch.Tensor  # [num_groups] float64; NaN for groups with no scored reward
    group_std: torch.Tensor  # [num_groups] float64; population std; NaN for groups with no scored reward
    tied_groups: torch.Tensor  # [num_groups] bool; all scored rewards equal (incl. a single scored reward)
    scored_groups: torch.Tensor  # [num_groups] bool; at least one scored (non-error) reward

    @property
    def num_groups(self) -> int:
        return int(self.tied_groups.numel())

    @property
    def num_tied(self) -> int:
        return int(self.tied_groups.sum().item())

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
) -> AdvantageResult:
    """Turn rewards into advantages, group by group.

    ``rewards`` is a flat tensor whose consecutive runs of ``group_size`` entries are the answers to one
    prompt (TRL's RepeatSampler order). NaN marks a metric-service error: that answer is left out of its
    group's mean and std and gets advantage 0.

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

    # float64 keeps the mean of values like 0.3 exact enough that the 4-decimal contract holds for any G.
    r = rewards.detach().to(dtype=torch.float64, device="cpu").view(-1, group_size)
    valid = ~torch.isnan(r)
    count = valid.sum(dim=1)
    scored_groups = count > 0
    r0 = torch.where(valid, r, torch.zeros_like(r))
    safe_count = count.clamp(min=1).to(torch.float64)
    mean = r0.sum(dim=1) / safe_count
    centered = torch.where(valid, r - mean.unsqueeze(1), torch.zeros_like(r))
    std = torch.sqrt((centered**2).sum(dim=1) / safe_count)

    big = torch.finfo(torch.float64).max
    r_max = torch.where(valid, r, torch.full_like(r, -big)).amax(dim=1)
    r_min = torch.where(valid, r, torch.full_like(r, big)).amin(dim=1)
    tied = scored_groups & ((r_max - r_min) <= TIE_TOLERANCE)

    if scale_rewards == "group":
        adv = centered / (std.unsqueeze(1) + eps)
    elif scale_rewards == "batch":
        all_valid = r[valid]
        batch_std = (
            torch.sqrt(((all_valid - all_valid.mean()) ** 2).mean())
            if all_valid.numel()
            else torch.tensor(0.0, dtype=torch.float64)
        )
        adv = centered / (batch_std + eps)
    else:
        adv = centered

    adv = torch.where(valid & ~tied.unsqueeze(1), adv, torch.zeros_like(adv))
    nan = torch.full_like(mean, float("nan"))
    return AdvantageResult(
        advantages=adv.reshape(-1).to(torch.float32),
        group_mean=torch.where(scored_groups, mean, nan),
        group_std=torch.where(scored_groups, std, nan),
        tied_groups=tied,
        scored_groups=scored_groups,
    )
