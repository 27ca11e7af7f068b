"""Statistics over all ranks of a data-parallel job: advantage normalisation that does not depend on
how many processes the batch was split over.

Under ``torch.distributed`` each rank holds a shard of the rollout. Normalising advantages with the
shard's own mean and standard deviation makes the update depend on the number of processes; the
functions here normalise with the moments of the union of all shards instead, at the price of one
small collective (an all-gather of three numbers per rank).

* :func:`local_moments` -- ``(count, mean, m2)`` of this rank's valid entries;
* :func:`combine_moments` -- the same triple for all ranks of a process group (one all-gather, then
  the pairwise update of Chan et al. folded in rank order);
* :func:`global_moments` -- both in one call;
* :func:`normalize_advantages` -- ``(x - mean) / max(std, eps)`` with the global mean and std, the
  convention of TorchRL's ``ClipPPOLoss(normalize_advantage=True)``.

With ``process_group=None`` nothing is communicated and the result is the local computation; with
a group of one process the result is the same, bit for bit. This module is not imported by
``import rl_triton``; import it as ``rl_triton.distributed``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["combine_moments", "global_moments", "local_moments", "normalize_advantages"]

# TorchRL's standardisation clamps the std at float32's resolution (1e-6).
DEFAULT_EPS = float(torch.finfo(torch.float32).resolution)

# all_gather_single replaces all_gather_into_tensor in recent PyTorch; older releases only have the latter. A
# build without distributed support has neither: the moments below still serve rl_triton.llm there.
_all_gather_single = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics of ``dtype`` values accumulate in (here and in :mod:`rl_triton.llm`)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _valid_mask(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a tensor or None, got {type(mask).__name__}")
    if mask.device != x.device:
        raise ValueError(f"mask is on {mask.device} but x is on {x.device}")
    try:
        return mask.to(torch.bool).expand_as(x)
    except RuntimeError as e:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to x of shape {tuple(x.shape)}") from e


def local_moments(x: torch.Tensor, mask: torch.Tensor | None = None):
    """``(count, mean, m2)`` of the entries of ``x`` where ``mask`` is true (all entries without a mask).

    Args:
        x: floating-point tensor of any shape. float16/bfloat16 accumulate in float32.
        mask: optional tensor broadcastable to ``x`` (bool, or any dtype: nonzero counts as valid).

    Returns:
        Three 0-d tensors in the accumulation dtype (float64 for float64 input, float32 otherwise), on
        ``x``'s device: the number of valid entries, their mean, and ``m2``, the sum of squared
        deviations from that mean. With no valid entry all three are 0 (never NaN). Entries outside the
        mask are never read arithmetically, so NaN or inf there does not leak into the moments.
        Statistics are constants: no gradient flows through them.
    """
    if not x.dtype.is_floating_point:
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    acc = _acc_dtype(x.dtype)
    m = _valid_mask(x, mask)
    xa = x.detach().to(acc)
    if m is not None:
        return _masked_moments(xa, m)
    count = torch.full((), x.numel(), dtype=acc, device=x.device)
    mean = xa.sum() / count.clamp_min(1)
    m2 = (xa - mean).square().sum()
    return count, mean, m2


def _masked_moments(xa: torch.Tensor, m: torch.Tensor):
    """:func:`local_moments` of ``xa``, already in the accumulation dtype, where the bool ``m`` of its shape is set;
    no checks, and gradients flow (:func:`rl_triton.llm.masked_mean` is differentiable on its PyTorch path)."""
    count = m.sum(dtype=xa.dtype)
    mean = torch.where(m, xa, 0).sum() / count.clamp_min(1)
    # Two passes (mean first, then squared deviations) rather than E[x^2] - E[x]^2: no cancellation.
    m2 = torch.where(m, xa - mean, 0).square().sum()
    return count, mean, m2


def combine_moments(count: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor, process_group=None):
    """Combines each rank's ``(count, mean, m2)`` into the moments of the union of all ranks' data.

    ``m2`` is the sum of squared deviations from the local mean over the local valid entries (what
    :func:`local_moments` returns). The ranks' triples are all-gathered in one collective (in float64)
    and folded in rank order, starting from rank 0's, with the pairwise update

        n = n_a + n_b;  d = mean_b - mean_a;  mean = mean_a + d * n_b / n;  m2 = m2_a + m2_b + d^2 n_a n_b / n

    A rank with ``n = 0`` contributes nothing: the fold selects the other operand (``torch.where``)
    instead of relying on the arithmetic, so its mean and m2 may be anything, NaN included.

    Args:
        count, mean, m2: tensors of one shape (usually 0-d; any common broadcast shape works
            elementwise), float32 or float64 (``count`` may be an integer tensor), all on one device --
            a CUDA device for an NCCL group.
        process_group: a ``torch.distributed`` process group (``torch.distributed.group.WORLD`` for all
            processes), or ``None`` for no communication.

    Returns:
        ``(count, mean, m2)`` over all ranks, each in its input's dtype; identical on every rank.
        With ``process_group=None`` the inputs themselves (the same objects). With a group of one
        process, tensors equal to the inputs bit for bit (float32 values round-trip through float64
        exactly). The collective carries no gradient.

    Every rank of the group must call this (it is a collective). There is no host synchronisation:
    no ``.item()`` and no branching on tensor values, so on CUDA it queues asynchronously.
    """
    if process_group is None:
        return count, mean, m2
    world = dist.get_world_size(process_group)
    local = torch.stack(torch.broadcast_tensors(*(t.detach().to(torch.float64) for t in (count, mean, m2))))
    # The flat (concatenated) output form: gloo does not accept the stacked one.
    gathered = torch.empty(world * local.numel(), dtype=local.dtype, device=local.device)
    _all_gather_single(gathered, local.reshape(-1), group=process_group)
    n, mu, s = _fold_moments(gathered.view(world, *local.shape))
    return n.to(count.dtype), mu.to(mean.dtype), s.to(m2.dtype)


def _fold_moments(gathered: torch.Tensor):
    """Folds ``gathered[r] = (count_r, mean_r, m2_r)`` in rank order, starting from rank 0's triple."""
    n, mu, s = gathered[0].unbind(0)
    for r in range(1, gathered.shape[0]):  # rank order, so every rank computes the same bits
        n_b, mu_b, s_b = gathered[r].unbind(0)
        total = n + n_b
        safe = torch.where(total > 0, total, torch.ones_like(total))
        d = mu_b - mu
        mu_ab = mu + d * n_b / safe
        s_ab = s + s_b + d * d * (n * n_b) / safe
        a_empty, b_empty = n == 0, n_b == 0
        mu = torch.where(b_empty, mu, torch.where(a_empty, mu_b, mu_ab))
        s = torch.where(b_empty, s, torch.where(a_empty, s_b, s_ab))
        n = total
    return n, mu, s


def global_moments(x: torch.Tensor, mask: torch.Tensor | None = None, *, process_group=None):
    """``(count, mean, m2)`` of the valid entries of ``x`` on all ranks of ``process_group``:
    :func:`local_moments` followed by :func:`combine_moments`. ``x`` may have a different shape on each
    rank (and no valid entry on some)."""
    return combine_moments(*local_moments(x, mask), process_group=process_group)


def normalize_advantages(
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    process_group=None,
    eps: float = DEFAULT_EPS,
    unbiased: bool = True,
) -> torch.Tensor:
    """Standardises ``advantages`` with the mean and standard deviation of all ranks' valid entries.

    ``(advantages - mean) / max(std, eps)``: the convention of TorchRL's PPO losses with
    ``normalize_advantage=True`` (``torchrl._utils._standardize``: ``std.clamp_min(eps)`` with eps the
    float32 resolution, 1e-6, and the unbiased std of ``torch.std``), not ``/ (std + eps)``. TorchRL's
    masked variant (a ``shifted_valid`` key in the loss input) uses the population std and eps 1e-4;
    pass ``unbiased=False, eps=1e-4`` to match that.

    Args:
        advantages: floating-point tensor of any shape (may differ between ranks). float16/bfloat16
            accumulate in float32; the result has the input's dtype.
        mask: optional tensor broadcastable to ``advantages``; only entries where it is true (nonzero)
            count toward the statistics. All entries are normalised with the same formula; entries
            outside the mask come out as ``(x - mean) / max(std, eps)`` too and are for the caller to ignore.
        process_group: ``torch.distributed`` process group whose ranks share the statistics, or
            ``None`` for this tensor alone (no communication).
        eps: lower bound on the standard deviation.
        unbiased: divide ``m2`` by ``count - 1`` (True, as ``torch.std``) or by ``count``. With one valid
            entry in all (or none) the variance is taken as 0, not NaN.

    Returns:
        A new tensor of ``advantages``' shape and dtype. Without a group it equals the local
        computation; with a group of one process it is bit-identical to that; with more processes it
        is what the local computation would give on the concatenation of all ranks' valid entries (up
        to rounding). The statistics are constants for autograd.

    Example::

        import torch.distributed as dist
        from rl_triton.distributed import normalize_advantages

        adv = normalize_advantages(batch["advantage"], process_group=dist.group.WORLD)
    """
    count, mean, m2 = global_moments(advantages, mask, process_group=process_group)
    denom = (count - 1 if unbiased else count).clamp_min(1)
    std = (m2 / denom).sqrt()
    acc = mean.dtype
    return ((advantages.to(acc) - mean) / std.clamp_min(eps)).to(advantages.dtype)
