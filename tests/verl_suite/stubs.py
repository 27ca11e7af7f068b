"""Stand-ins that let verl's estimator modules import without the rest of verl or its heavy dependencies.

Used where verl's dependencies cannot be installed (the GPU machine: no package index, and ray's wheel is too
large to carry). Only three of verl's modules are imported for real: ``verl.trainer.ppo.core_algos``,
``verl.utils.torch_functional`` and ``verl.utils.groupwise``, plus the stdlib-only ``verl.utils.import_utils``.
The packages above them (whose ``__init__`` imports ray, hydra, transformers, ...) are empty package modules
pointing at the installed sources; the names those three modules import from elsewhere are small stand-ins.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import types

import torch


def _module(name: str, path: str | None = None, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    if path is not None:
        mod.__path__ = [path]  # a package whose submodules load from the real sources, without its __init__
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:  # as an import would: verl.trainer reachable as an attribute of verl
        setattr(sys.modules[parent], child, mod)
    return mod


def _class(name: str, module: str) -> type:
    return type(name, (), {"__module__": module, "__init__": lambda self, *a, **k: None})


@dataclasses.dataclass
class AlgoConfig:
    """The fields of verl's ``AlgoConfig`` that the estimators read."""

    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = "gae"
    norm_adv_by_std_in_grpo: bool = True

    def get(self, key, default=None):
        return getattr(self, key, default)

    def __getitem__(self, key):
        return getattr(self, key)


def _device_name() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def install(verl_root: str) -> None:
    """Registers the stand-ins in ``sys.modules``; ``verl_root`` is the folder of the installed ``verl``
    package (with ``trainer/ppo/core_algos.py``)."""
    if not os.path.isfile(os.path.join(verl_root, "trainer", "ppo", "core_algos.py")):
        raise FileNotFoundError(f"no verl sources in {verl_root}")
    for dep, names in (("omegaconf", ("DictConfig",)), ("tensordict", ("TensorDict",)),
                       ("transformers", ("PreTrainedTokenizer",))):  # fmt: skip
        if importlib.util.find_spec(dep) is None:
            _module(dep, **{n: _class(n, dep) for n in names})
    _module("verl", verl_root)
    utils = _module("verl.utils", os.path.join(verl_root, "utils"))
    _module("verl.trainer", os.path.join(verl_root, "trainer"))
    _module("verl.trainer.ppo", os.path.join(verl_root, "trainer", "ppo"))
    _module("verl.trainer.config", AlgoConfig=AlgoConfig)
    _module("verl.workers", os.path.join(verl_root, "workers"))
    _module("verl.workers.config", ActorConfig=_class("ActorConfig", "verl.workers.config"))
    _module(
        "verl.utils.device",
        get_device_name=_device_name,
        get_torch_device=lambda: getattr(torch, _device_name()),
        is_npu_available=False,
        is_cuda_available=torch.cuda.is_available(),
    )
    from verl.utils import groupwise

    utils.as_torch_index, utils.group_mean_std = groupwise.as_torch_index, groupwise.group_mean_std
