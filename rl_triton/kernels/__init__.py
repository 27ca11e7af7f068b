"""Triton kernels' shared machinery: launch plans as data (:mod:`.plans`, no Triton), the scan and the loop that
drives it (:mod:`.core`) and the launcher (:mod:`.launch`). The algorithms are in :mod:`rl_triton.ops`. Nothing
is imported here, so that ``import rl_triton.kernels.plans`` does not import Triton."""
