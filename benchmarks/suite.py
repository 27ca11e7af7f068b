"""Configurations and the measurement of one configuration (function, num_envs, seq_len, dtype)."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from . import baselines as B
from . import specs, timing

GRID_ENVS = (64, 256, 1024, 4096, 16384)
GRID_STEPS = (128, 512, 1024, 2048, 4096)
LONG = ((1, 1 << 20), (1, 1 << 24), (16, 1 << 20), (64, 1 << 18))
SHORT = ((32768, 8), (1 << 20, 8), (1 << 18, 32), (65536, 128))
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_SHAPES = ((4, 16),)


@dataclass(frozen=True)
class Config:
    function: str
    num_envs: int
    seq_len: int
    dtype: str
    family: str  # "grid", "long" (long sequences), "short" (short horizons), "quick" or "custom"

    def describe(self) -> str:
        return f"{self.function} {self.num_envs}x{self.seq_len} {self.dtype}"


def full_configs(functions, dtypes=("float32", "bfloat16")) -> list[Config]:
    shapes = [(n, t, "grid") for n in GRID_ENVS for t in GRID_STEPS]
    shapes += [(n, t, "long") for n, t in LONG] + [(n, t, "short") for n, t in SHORT]
    return [Config(f, n, t, d, fam) for f in functions for d in dtypes for n, t, fam in shapes]


def quick_configs(functions) -> list[Config]:
    out = [Config(f, n, t, "float32", "quick") for f in functions for n, t in ((64, 512), (4096, 2048))]
    if "compute_gae" in functions:
        out += [
            Config("compute_gae", 4096, 2048, "bfloat16", "quick"),
            Config("compute_gae", 1, 1 << 20, "float32", "long"),
            Config("compute_gae", 32768, 8, "float32", "short"),
        ]
    return out


def custom_configs(functions, shapes, dtypes) -> list[Config]:
    return [Config(f, n, t, d, "custom") for f in functions for d in dtypes for n, t in shapes]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"64x512,4096x2048"`` -> [(64, 512), (4096, 2048)]."""
    out = []
    for part in text.split(","):
        part = part.strip().lower().replace("×", "x")
        if not part:
            continue
        n, _, t = part.partition("x")
        try:
            shape = (int(n), int(t))
        except ValueError:
            raise ValueError(f"bad shape {part!r}; expected NUM_ENVSxSEQ_LEN, e.g. 64x512") from None
        if min(shape) < 1:
            raise ValueError(f"bad shape {part!r}: sizes must be positive")
        out.append(shape)
    return out


def base_row(cfg, ctx) -> dict:
    """The fields every result row starts with: the configuration and how its numbers were checked."""
    return {
        "function": cfg.function,
        "num_envs": cfg.num_envs,
        "seq_len": cfg.seq_len,
        "dtype": cfg.dtype,
        "family": cfg.family,
        "verified_on": ctx.window.describe(),
        "tolerance": ctx.tol,
    }


def measure(cfg: Config, opts: B.Options) -> dict:
    """Checks our primary call and every applicable baseline against the float64 reference, then
    times them. Returns one JSON row."""
    spec = specs.SPECS[cfg.function]
    dtype = DTYPES[cfg.dtype]
    x = specs.Inputs(cfg.num_envs, cfg.seq_len, dtype, opts.device)
    ctx = B.Context(spec, x, opts)
    row = base_row(cfg, ctx)
    try:
        ours = ctx.ours_call_us(f"{spec.name}:primary")  # checks against the reference first
        call, _, _ = B.ours_call(f"{spec.name}:primary", x)
        with torch.no_grad():
            k_us = timing.kernel_us(lambda: call(None), opts.device, opts.budget, graph=True)
        nbytes = spec.nbytes(x)
        copy = timing.copy_gbps(nbytes, opts.device, opts.budget)
        gbps = nbytes / (k_us * 1e-6) / 1e9
        row |= {
            "correct": ours["correct"],
            "max_abs_err": ours["max_abs_err"],
            "err": ours["err"],
            "kernel_us": k_us,
            "full_call_us": ours["full_call_us"],
            "bytes": nbytes,
            "GBps": gbps,
            "copy_GBps": copy,
            "fraction_of_copy": gbps / copy,
        }
        row["baselines"] = []
        for name, baseline in B.BASELINES.items():
            if opts.baselines is not None and name not in opts.baselines:
                continue
            if not baseline.applies(spec):
                continue
            skip = baseline.skip_reason(spec, cfg.num_envs, cfg.seq_len, opts)
            if skip:
                row["baselines"].append(
                    {"name": name, "label": baseline.describe(spec), "status": "skipped", "reason": skip}
                )
                continue
            try:
                row["baselines"].append(baseline.measure(ctx))
            except torch.cuda.OutOfMemoryError as exc:
                row["baselines"].append(
                    {"name": name, "label": baseline.describe(spec), "status": "failed", "reason": f"OOM: {exc}"[:300]}
                )
            _free(opts.device)
        for b in row["baselines"]:  # do_bench against do_bench, where the baseline has one (torch.compile)
            if b.get("status") == "ok" and b.get("kernel_us") and b.get("ours") == "primary":
                b["speedup_kernel"] = b["kernel_us"] / k_us
        row["ours_forms"] = {k.split(":")[1]: v for k, v in ctx.ours.items()}
    finally:
        x.release()
        del ctx
        _free(opts.device)
    return row


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
