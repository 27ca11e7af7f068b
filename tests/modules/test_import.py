"""Import hygiene: TorchRL is an optional extra, only rl_triton.modules may import it.

One child process (a fresh interpreter: nothing imported yet) imports the core package first, then
rl_triton.modules, and reports what each step found; the three tests read its report (one import of torch and
TorchRL instead of three)."""

import json
import os
import subprocess
import sys

import pytest

_REPORT = """
import json, sys, types
import rl_triton, rl_triton.functional
core = sorted(m for m in ('torchrl', 'tensordict') if m in sys.modules)
import rl_triton.modules as m
foreign = sorted(k for k, v in vars(m).items()
                 if isinstance(v, types.ModuleType) and not v.__name__.startswith('rl_triton.'))
print(json.dumps({"core": core, "torchrl": 'torchrl' in sys.modules, "all": sorted(m.__all__), "foreign": foreign}))
"""


@pytest.fixture(scope="module")
def report() -> dict:
    res = subprocess.run(
        [sys.executable, "-c", _REPORT], capture_output=True, text=True, env=dict(os.environ), timeout=120
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_core_package_does_not_import_torchrl(report):
    assert report["core"] == [], f"`import rl_triton` imported {report['core']}"


def test_modules_subpackage_imports_torchrl(report):
    assert report["torchrl"] is True
    for name in ("GAE", "MultiAgentGAE", "Retrace", "Reward2GoTransform", "TD0Estimator", "TD1Estimator",
                 "TDLambdaEstimator", "VTrace", "TokenGAE", "GroupAdvantage", "register_with_torchrl"):  # fmt: skip
        assert name in report["all"]


def test_modules_namespace_holds_only_its_own_names(report):
    """No module object of another package (tensordict, torchrl) among rl_triton.modules' attributes."""
    assert report["foreign"] == [], report["foreign"]
