"""Import hygiene: TorchRL is an optional extra, only rl_triton.modules may import it.

One child process (a fresh interpreter: nothing imported yet) imports the core package first, then
rl_triton.modules, and reports what each step found (one import of torch and TorchRL instead of three)."""

import json
import os
import subprocess
import sys

_REPORT = """
import json, sys, types
import rl_triton, rl_triton.functional
core = sorted(m for m in ('torchrl', 'tensordict') if m in sys.modules)
import rl_triton.modules as m
foreign = sorted(k for k, v in vars(m).items()
                 if isinstance(v, types.ModuleType) and not v.__name__.startswith('rl_triton.'))
print(json.dumps({"core": core, "torchrl": 'torchrl' in sys.modules, "all": sorted(m.__all__), "foreign": foreign}))
"""


def test_import_hygiene():
    """The core package imports neither TorchRL nor tensordict; rl_triton.modules imports TorchRL and exports its
    estimators and transforms; no module object of another package (tensordict, torchrl) is among rl_triton.modules'
    attributes. One test, not three: a module fixture shared by three tests ran once per pytest-xdist worker."""
    res = subprocess.run(
        [sys.executable, "-c", _REPORT], capture_output=True, text=True, env=dict(os.environ), timeout=120
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["core"] == [], f"`import rl_triton` imported {report['core']}"
    assert report["torchrl"] is True, "rl_triton.modules did not import torchrl"
    for name in ("GAE", "MultiAgentGAE", "Retrace", "Reward2GoTransform", "TD0Estimator", "TD1Estimator",
                 "TDLambdaEstimator", "VTrace", "TokenGAE", "GroupAdvantage", "register_with_torchrl"):  # fmt: skip
        assert name in report["all"], name
    assert report["foreign"] == [], f"modules of other packages among rl_triton.modules' names: {report['foreign']}"
