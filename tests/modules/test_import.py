"""Import hygiene: TorchRL is an optional extra, only rl_triton.modules may import it."""

import os
import subprocess
import sys


def _run(code: str) -> str:
    env = dict(os.environ)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_core_package_does_not_import_torchrl():
    out = _run(
        "import sys, rl_triton, rl_triton.functional\n"
        "print(sorted(m for m in ('torchrl', 'tensordict') if m in sys.modules))"
    )
    assert out == "[]", f"`import rl_triton` imported {out}"


def test_modules_subpackage_imports_torchrl():
    out = _run("import sys, rl_triton.modules as m\nprint('torchrl' in sys.modules, sorted(m.__all__))")
    assert out.startswith("True")
    for name in ("GAE", "MultiAgentGAE", "Retrace", "Reward2GoTransform", "TD0Estimator", "TD1Estimator",
                 "TDLambdaEstimator", "VTrace", "TokenGAE", "GroupAdvantage", "register_with_torchrl"):  # fmt: skip
        assert f"'{name}'" in out


def test_modules_namespace_holds_only_its_own_names():
    """No module object of another package (tensordict, torchrl) among rl_triton.modules' attributes."""
    out = _run(
        "import types, rl_triton.modules as m\n"
        "print(sorted(k for k, v in vars(m).items() if isinstance(v, types.ModuleType)"
        " and not v.__name__.startswith('rl_triton.')))"
    )
    assert out == "[]", out
