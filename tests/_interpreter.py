"""A test-session speed-up of Triton's interpreter (TRITON_INTERPRET=1): no re-patching of triton.language on every
call of a device function.

A launch under the interpreter (``GridExecutor.__call__``) patches the builtins of ``triton.language`` (and
``tl.core``, ``tl.tensor``, ``tl.math``) with interpreted ones, runs the grid, then restores them. Every call of a
``@triton.jit`` device function inside the kernel (``InterpretedFunction.__call__``) runs the same patching again
(``_patch_lang``: ``inspect.getmembers`` over the language modules, about 1 ms), although the launch has already
patched those modules: it finds nothing left to patch, and its scope is discarded without a restore. Our kernels
call a few dozen device functions per program, so this came to about half of the interpreted kernels' time
(benchmarks' CPU smoke run: 14 of 26 s).

:func:`install` skips that repeated patching when every language module the device function sees (``tl``,
``tl.core``) has already been patched in this launch; a device function that sees one that has not is patched
as before. The kernels still run in Triton's interpreter, with the same patched builtins; only the redundant
work goes. If this Triton's interpreter does not have the functions patched here, nothing is changed.
"""

from __future__ import annotations

import inspect
import threading

_LOCAL = threading.local()  # .patched: ids of the language modules patched in the current launch (None outside)


def install() -> bool:
    """Wraps the interpreter's ``_patch_lang`` and ``GridExecutor.__call__`` (once). True when installed."""
    try:
        from triton.runtime import interpreter as ti
    except ImportError:  # pragma: no cover - triton without an interpreter
        return False
    original = getattr(ti, "_patch_lang", None)
    executor = getattr(ti, "GridExecutor", None)
    scope_cls = getattr(ti, "_LangPatchScope", None)
    if original is None or executor is None or scope_cls is None:
        return False
    if getattr(original, "_rl_triton_tests", False):
        return True
    langs = (ti.tl, ti.tl.core)

    cache: dict = {}  # fn -> (size of its globals, the language modules among them)

    def seen(fn) -> set[int]:
        # the modules _patch_lang patches for fn: the language modules among its globals (scanned again when the
        # globals grow, as the interpreter's rewrite makes them)
        size = len(fn.__globals__)
        hit = cache.get(fn)
        if hit is None or hit[0] != size:
            values = list(fn.__globals__.values())
            hit = cache[fn] = (size, {id(v) for v in values if inspect.ismodule(v) and v in langs})
        return hit[1]

    def patch_lang(fn):
        patched = getattr(_LOCAL, "patched", None)
        if patched is None:  # not inside a launch: Triton's own
            return original(fn)
        need = seen(fn)
        if need and need <= patched:
            return scope_cls()  # nothing to patch, nothing to restore
        scope = original(fn)
        patched |= need
        return scope

    run = executor.__call__

    def launch(self, *args, **kwargs):
        saved, _LOCAL.patched = getattr(_LOCAL, "patched", None), set()
        try:
            return run(self, *args, **kwargs)
        finally:
            _LOCAL.patched = saved

    patch_lang._rl_triton_tests = True
    patch_lang.original = original
    ti._patch_lang = patch_lang
    executor.__call__ = launch
    return True
