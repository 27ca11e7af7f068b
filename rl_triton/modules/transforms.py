"""TorchRL transforms backed by rl_triton."""

from __future__ import annotations

import torch
from torchrl.envs.transforms import Reward2GoTransform as _TorchRLReward2Go

from .. import functional as F
from .._discounts import in_unit
from ._base import CachedScalars
from ._common import copy_signature, from_rows, to_rows

__all__ = ["Reward2GoTransform"]


class Reward2GoTransform(CachedScalars, _TorchRLReward2Go):
    """Discounted reward-to-go of finished episodes, rl_triton-backed.

    Replaces :class:`torchrl.envs.transforms.Reward2GoTransform`; same constructor (``gamma``,
    ``in_keys``, ``out_keys``, ``done_key``), same inverse-only behaviour (replay buffers and
    collector ``postproc``), same errors::

        from rl_triton.modules import Reward2GoTransform   # instead of torchrl.envs.transforms

    As in TorchRL, time is the second-to-last dim of the reward (``[*B, T, F]``, e.g.
    ``[*B, T, 1]``); ``done`` must have the reward's shape. The sum restarts after every done step
    and is cut (not bootstrapped) at the end of the buffer:
    :func:`rl_triton.compute_discounted_returns` with ``terminateds=done``.

    Deviation (a fix): with ``gamma=0`` TorchRL 0.14's ``reward2go`` fails (``IndexError`` in its
    convolution); this returns the reward itself. Falls back to TorchRL's
    ``reward2go`` for a non-scalar (or grad-requiring) ``gamma``, ``gamma`` outside [0, 1],
    non-float rewards, mismatched shapes or 1-D rewards (TorchRL raises its own errors there).
    """

    _SCALAR_BUFFERS = ("gamma",)

    @copy_signature(_TorchRLReward2Go.__init__)
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._prime_scalars(gamma=args[0] if args else kwargs.get("gamma", 1.0))

    def _inv_apply_transform(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        gamma = self._scalar("gamma")
        if (
            not in_unit(gamma)
            or reward.ndim < 2
            or reward.shape != done.shape
            or not reward.is_floating_point()
            or reward.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
        ):
            return super()._inv_apply_transform(reward, done)
        time_dim = reward.ndim - 2
        out = F.compute_discounted_returns(to_rows(reward, time_dim), to_rows(done, time_dim), gamma=gamma)
        return from_rows(out, reward.shape, time_dim)
