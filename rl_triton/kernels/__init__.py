"""Triton kernels: the shared scan core (:mod:`.core`), the fused per-algorithm kernels
(:mod:`.fused`) and their launchers (:mod:`.launch`)."""

from .. import _config
from . import core

if _config.INTERPRET:
    from ._interpret import install

    install(core.linear_combine, core.linear_combine_next, core.plain_combine, core.plain_combine_next)
