"""ggml's BLAS backend (ggml-blas, in a ``PYGGML_BACKENDS=cpu,blas`` build): OpenBLAS's sgemm for
the large ``MUL_MAT`` and every ``OUT_PROD`` of a graph, the rest left to the CPU by the scheduler.

``ggml_backend_blas_device_supports_op`` accepts some layouts its kernels cannot compute: they
abort (``GGML_ASSERT``) or read the data wrongly, silently. :func:`blas_kernel_supports` is the
stricter answer; :class:`BLASBackend` and :class:`~pyggml.backends.sched.Scheduler` refuse such a node
with a ValueError before computing (found by a differential sweep of 44 layouts against NumPy
and the CPU backend).
"""
from __future__ import annotations

from typing import Any

from .backend import Backend
from ..raw import dl, lib
from ..core.tensor import Tensor, tensor_arg

__all__ = ["BLASBackend", "blas_kernel_supports"]

_F32 = lib.GGML_TYPE_F32


def _mul_mat_ok(p: Any) -> bool:
    """ggml_backend_blas_mul_mat asserts ``nb00 == type size`` and ``nb10 == 4`` (a quantized
    src0 viewed with nb1 = 0 and transposed passes ggml_is_contiguous, which skips nb0 when ne0 is
    one block), and of the destination ``nb0 == 4 <= nb1 <= nb2 <= nb3`` (an empty batch,
    ne[2] == 0, gives nb3 == 0)."""
    s0, s1 = p.src[0], p.src[1]
    nb = p.nb
    return bool(s0.nb[0] == lib.ggml_type_size(s0.type) and s1.nb[0] == 4
                and nb[0] == 4 <= nb[1] <= nb[2] <= nb[3])


def _out_prod_ok(p: Any) -> bool:
    """ggml_backend_blas_out_prod reads a transposed src1 (``ggml_is_transposed``, which
    supports_op accepts) as the transpose of a packed matrix (``lda = k``): a transposed view of
    a row-padded, strided or permuted tensor gave wrong values silently. Its transpose must be
    contiguous: ``nb11 == 4`` and ``nb10 == 4 * ne11`` (dims of one element excepted; with
    ``ne11 == 0`` nothing is read)."""
    s1 = p.src[1]
    if not lib.ggml_is_transposed(s1):
        return True
    ne, nb = s1.ne, s1.nb
    return bool(ne[1] == 0 or ((ne[1] == 1 or nb[1] == 4) and (ne[0] <= 1 or nb[0] == 4 * ne[1])))


_BLAS_CHECKS = {lib.GGML_OP_MUL_MAT: _mul_mat_ok, lib.GGML_OP_OUT_PROD: _out_prod_ok}


def _blas_kernel_supports_raw(p: Any) -> bool:
    check = _BLAS_CHECKS.get(p.op)
    return check is None or check(p)


def blas_kernel_supports(node: Tensor) -> bool:
    """Whether ggml-blas's kernels compute ``node`` correctly, given that its ``supports_op``
    accepted it (a stricter check for ``MUL_MAT`` and ``OUT_PROD``: see the module docstring)."""
    return _blas_kernel_supports_raw(tensor_arg(node, "node")._ptr)


class BLASBackend(Backend):
    """The BLAS backend (``ggml_backend_blas_init``, or ``device_by_name("BLAS").init()``),
    owned. Its ``supports_op`` is narrowed by :func:`blas_kernel_supports`.

    Raises :class:`~pyggml.errors.BackendNotAvailableError` in a build without it."""

    def __init__(self, n_threads: int | None = None):
        dl.require("blas")
        # getattr: ggml-blas.h is bound only in a build with the BLAS backend (the type stub of
        # the default build does not have it)
        super().__init__(getattr(lib, "ggml_backend_blas_init")())
        if n_threads is not None:
            self.set_n_threads(n_threads)

    @classmethod
    def _wrap(cls, ptr: Any) -> "BLASBackend":
        self = cls.__new__(cls)
        Backend.__init__(self, ptr)
        return self

    def set_n_threads(self, n: int) -> bool:
        """``ggml_backend_blas_set_n_threads`` (OpenBLAS's threads, set before each product);
        returns True. Raises ValueError outside 1..GGML_MAX_N_THREADS."""
        if not isinstance(n, int) or not 1 <= n <= lib.GGML_MAX_N_THREADS:
            raise ValueError(f"n_threads must be 1..{lib.GGML_MAX_N_THREADS}, not {n!r}")
        getattr(lib, "ggml_backend_blas_set_n_threads")(self.ptr, n)
        return True

    def _supports_raw(self, p: Any) -> bool:
        return bool(lib.ggml_backend_supports_op(self._ptr, p)) and _blas_kernel_supports_raw(p)

    _has_kernel_table = True

    def _kernel_ok(self, p: Any) -> bool:
        return _blas_kernel_supports_raw(p)

    def _why_not(self, p: Any) -> str:
        if lib.ggml_backend_supports_op(self._ptr, p) and p.op == lib.GGML_OP_OUT_PROD:
            return ("ggml-blas reads a transposed src1 as the transpose of a packed matrix: make "
                    "it contiguous with Context.cont first")
        if lib.ggml_backend_supports_op(self._ptr, p):
            return ("ggml-blas's kernel asserts unit-stride sources and an ordered result "
                    "(a transposed quantized source or an empty batch): Context.cont the source, "
                    "or leave this node to the CPU")
        return super()._why_not(p)
