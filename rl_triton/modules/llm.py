"""TensorDict modules for the token-level estimators of :mod:`rl_triton.llm`.

* :class:`TokenGAE`: masked GAE over the policy's tokens (``compute_gae_advantage_return``), whitened.
* :class:`GroupAdvantage`: GRPO, Dr. GRPO or RLOO outcome advantages per group of sequences, a TorchRL
  ``Transform`` in the role of TorchRL's ``MCAdvantage`` (called on a batch, or as a replay-buffer transform).

Entries are ``(B, T)`` token tensors (a trailing singleton ``(B, T, 1)``, TorchRL's reward layout, is accepted
and kept on the outputs). Default keys follow TorchRL's LLM stack: rewards at ``("next", "reward")``, the
policy-token mask at ``("masks", "all_assistant_mask")`` (what its LLM wrappers write), the output at
``"advantage"`` (what ``GRPOLoss`` reads), values and value targets at TorchRL's estimator names
``"state_value"`` and ``"value_target"``, the group id at ``"query"`` (``MCAdvantage``'s ``prompt_key``).
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torchrl.envs.transforms import Transform

from .. import llm as _llm
from ._common import missing_entry

__all__ = ["GroupAdvantage", "TokenGAE"]


def _unflatten_key(key: NestedKey) -> NestedKey:
    if isinstance(key, tuple) and len(key) == 1:
        return key[0]
    return key


class _KeyedMixin:
    """``set_keys`` over an ``_AcceptedKeys`` dataclass; unknown names raise, as TorchRL's do."""

    @dataclasses.dataclass
    class _AcceptedKeys:
        pass

    def _init_keys(self) -> None:
        self._tensor_keys = self._AcceptedKeys()
        self._refresh_keys()

    @property
    def tensor_keys(self):
        return self._tensor_keys

    def set_keys(self, **kwargs):
        names = {f.name for f in dataclasses.fields(self._AcceptedKeys)}
        for name, key in kwargs.items():
            if name not in names:
                raise ValueError(f"{type(self).__name__}.set_keys: {name!r} is not a key name (valid: {sorted(names)})")
            if key is None:
                raise ValueError(f"{type(self).__name__}.set_keys: {name}=None is not a key")
            setattr(self._tensor_keys, name, _unflatten_key(key))
        self._refresh_keys()
        return self

    def _get(self, td: TensorDictBase, field: str, role: str):
        key = getattr(self._tensor_keys, field)
        x = td.get(key, None)
        if x is None:
            raise missing_entry(self, key, role, field)
        return x


def _token_rows(x: torch.Tensor, name: str) -> torch.Tensor:
    """``(B, T)`` from ``(B, T)`` or ``(B, T, 1)``."""
    if x.ndim == 3 and x.shape[-1] == 1:
        x = x.squeeze(-1)
    if x.ndim != 2:
        raise ValueError(f"{name} must be (B, T) or (B, T, 1) token entries, got shape {tuple(x.shape)}")
    return x


class TokenGAE(_KeyedMixin, TensorDictModuleBase):
    """Masked token-level GAE on a tensordict (:func:`rl_triton.llm.compute_gae_advantage_return`).

    A policy token bootstraps from the value at the next policy token; the other tokens (prompt, tool output,
    padding) pass the running advantage through, so ``gamma`` and ``lmbda`` count policy tokens.

    Keys (:meth:`set_keys`; nested tuples accepted):

    * ``reward`` = ``("next", "reward")``: token-level rewards ``(B, T)`` or ``(B, T, 1)``.
    * ``value`` = ``"state_value"``: values, the reward's shape. When absent and ``value_network`` is given,
      ``value_network(tensordict)`` is called to write it.
    * ``mask`` = ``("masks", "all_assistant_mask")``: nonzero on the policy's tokens.
    * ``advantage`` = ``"advantage"`` and ``value_target`` = ``"value_target"`` (written, the reward's shape):
      the advantages, whitened over the masked tokens when ``whiten=True`` (verl's default), and ``L + V``.

    Args:
        gamma, lmbda: floats in [0, 1], 0-d or ``(B,)`` tensors.
        value_network: optional module writing the value key.
        whiten: whiten the advantages (default True). ``False`` writes ``value_target − value`` instead.
        check, process_group, plan: passed to :func:`~rl_triton.llm.compute_gae_advantage_return`.

    A missing entry raises :class:`~rl_triton.modules.MissingEntryError` naming the key.
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        reward: NestedKey = ("next", "reward")
        value: NestedKey = "state_value"
        mask: NestedKey = ("masks", "all_assistant_mask")
        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"

    def __init__(
        self,
        *,
        gamma=1.0,
        lmbda=0.95,
        value_network: torch.nn.Module | None = None,
        whiten: bool = True,
        check: bool = True,
        process_group=None,
        plan=None,
    ):
        super().__init__()
        self.gamma, self.lmbda = gamma, lmbda
        self.value_network = value_network
        self.whiten, self.check, self.process_group, self.plan = whiten, check, process_group, plan
        self._init_keys()

    def _refresh_keys(self) -> None:
        k = self._tensor_keys
        self.in_keys = [k.reward, k.value, k.mask]
        self.out_keys = [k.advantage, k.value_target]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        reward = self._get(tensordict, "reward", "token-level rewards")
        mask = self._get(tensordict, "mask", "the policy-token mask")
        key = self._tensor_keys.value
        if key not in tensordict.keys(include_nested=True) and self.value_network is not None:
            self.value_network(tensordict)
        hint = "" if self.value_network is not None else " and no value_network was given to write it"
        value = tensordict.get(key, None)
        if value is None:
            raise missing_entry(self, key, "the values", "value", hint)
        r, v, m = _token_rows(reward, "reward"), _token_rows(value, "value"), _token_rows(mask, "mask")
        adv, ret = _llm.compute_gae_advantage_return(
            r, v, m, self.gamma, self.lmbda, self.process_group, check=self.check, plan=self.plan
        )
        if not self.whiten:
            adv = ret - v
        tensordict.set(self._tensor_keys.advantage, adv.reshape(reward.shape))
        tensordict.set(self._tensor_keys.value_target, ret.reshape(reward.shape))
        return tensordict


_KINDS = ("grpo", "drgrpo", "rloo")


class GroupAdvantage(_KeyedMixin, Transform):
    """Outcome advantages per group of sequences (:func:`rl_triton.llm.compute_grpo_outcome_advantage`,
    :func:`~rl_triton.llm.compute_rloo_outcome_advantage`), as a TorchRL transform.

    It plays the role of TorchRL's ``MCAdvantage`` in front of ``GRPOLoss``, for batches that hold whole groups
    (no queueing across calls): ``transform(td)`` computes on a batch, and appended to a replay buffer it runs on
    ``extend`` (the inverse path). Each sequence's score is the sum of its rewards; ``kind`` picks

    * ``"grpo"``: ``(s − μ_g) / (σ_g + epsilon)`` (unbiased σ; a group of one gets ``s``),
    * ``"drgrpo"``: ``s − μ_g`` (Dr. GRPO, no std normalisation),
    * ``"rloo"``: ``s`` minus the mean of the group's other scores,

    multiplied by the mask over the tokens.

    Keys (:meth:`set_keys`; nested tuples accepted):

    * ``group`` = ``"query"``: one id per sequence, an integer tensor ``(B,)`` / ``(B, 1)`` or non-tensor ids
      (prompt strings, uids).
    * ``reward`` = ``("next", "reward")``: token rewards ``(B, T)`` / ``(B, T, 1)``, or one reward per sequence
      ``(B,)`` / ``(B, 1)``.
    * ``mask`` = ``("masks", "all_assistant_mask")``: ``(B, T)``, nonzero on the policy's tokens.
    * ``advantage`` = ``"advantage"`` (written): token rewards' shape, or ``(B, T)`` for sequence rewards.
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        group: NestedKey = "query"
        reward: NestedKey = ("next", "reward")
        mask: NestedKey = ("masks", "all_assistant_mask")
        advantage: NestedKey = "advantage"

    def __init__(self, kind: str = "grpo", *, epsilon: float = 1e-6):
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        super().__init__()
        self.kind, self.epsilon = kind, float(epsilon)
        self._init_keys()

    def _refresh_keys(self) -> None:
        k = self._tensor_keys
        self.in_keys = [k.group, k.reward, k.mask]
        self.out_keys = [k.advantage]

    def _group_ids(self, td: TensorDictBase, b: int):
        key = self._tensor_keys.group
        if key not in td.keys(include_nested=True):
            raise missing_entry(self, key, "the group ids", "group")
        ids = td.get(key)
        if isinstance(ids, torch.Tensor):
            return ids.reshape(b) if ids.numel() == b else ids
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if not isinstance(ids, list):  # one non-tensor value shared by the batch
            ids = [ids] * b
        return ids

    def _advantage(self, td: TensorDictBase) -> TensorDictBase:
        reward = self._get(td, "reward", "the rewards")
        m = _token_rows(self._get(td, "mask", "the policy-token mask"), "mask")
        b, t = m.shape
        if reward.ndim == 1 or (reward.numel() == b and t != 1):  # one reward per sequence
            r = reward.new_zeros((b, t))
            r[:, 0] = reward.reshape(b)
            out_shape = m.shape
        else:
            r = _token_rows(reward, "reward")
            out_shape = reward.shape
        index = self._group_ids(td, b)
        if self.kind == "rloo":
            adv, _ = _llm.compute_rloo_outcome_advantage(r, m, index, self.epsilon)
        else:
            adv, _ = _llm.compute_grpo_outcome_advantage(r, m, index, self.epsilon, self.kind == "grpo")
        td.set(self._tensor_keys.advantage, adv.reshape(out_shape))
        return td

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._advantage(tensordict)

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._advantage(next_tensordict)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._advantage(tensordict)
