"""NumPy kernels for ggml ops: the compute half of a ggml backend written in Python.

``supports(node)`` says whether :func:`compute` handles a graph node (its op, types, op
parameters and shapes); ``compute(node)`` reads ``node``'s sources from host memory and writes
the result into ``node``'s own data, honouring ``node.nb`` (the destination may be a strided
view, e.g. the view of ``b`` that ``ggml_cpy`` returns, or an in-place view of a source).
:data:`OPS` is the op table behind both, keyed by ``GGML_OP_*``.

A node is a :class:`pyggml.Tensor` or a raw cffi ``struct ggml_tensor *`` (what a backend's
``graph_compute`` gets from ``ggml_graph_node``). Shapes below are ggml ``ne`` order
(``ne[0]`` fastest); NumPy arrays are ``ne`` reversed.

**Numerics.** The reference is ggml's CPU backend (``ggml-cpu/ops.cpp``, ``binary-ops.cpp``,
``unary-ops.cpp``, ``vec.h``). Element-wise results are computed in float32 from float32 inputs
(F16/BF16 sources are widened first, results are rounded to the destination type with ggml's
rounding: round-to-nearest-even for F16 and BF16, truncation for F32 -> I32), transcendental
functions in float64 and rounded once. Where the CPU deliberately approximates, the
approximation is reproduced:

* ``GELU`` (tanh form) and ``GEGLU``: the CPU reads a 65536-entry F16 table: ``x`` is rounded
  to F16, the tanh formula is evaluated and the result rounded to F16; for F32 inputs
  ``x <= -10`` gives 0 and ``x >= 10`` gives ``x``. ``GELU_QUICK``/``GEGLU_QUICK`` use their
  own F16 table with no cut-off. So the CPU's F32 GELU is off the exact formula by up to
  4e-3 (near x = 8; NMSE ~5e-8 over [-9.5, 9.5]); this module returns the CPU's values.
* ``GELU_ERF`` is computed accurately (erf in float64); the CPU's ``1.0f + erff(x/√2)`` loses
  relative precision in the far negative tail, where the values are below 1e-5 anyway.
* ``ARGMAX`` returns the *last* index of the maximum (ggml's loop updates it on ties).
* Reductions accumulate in float64 (the CPU uses ``ggml_float`` = double for most of them).
* ``MUL_MAT``/``OUT_PROD`` dequantize quantized/F16/BF16 weights exactly and multiply in
  float32; the CPU instead rounds ``src1`` to the weight's ``vec_dot_type`` (F16, Q8_0, Q8_K)
  first, so results differ by that rounding (test-backend-ops allows NMSE 5e-4 for them).

Errors: :func:`compute` raises ValueError for a node :func:`supports` rejects, for a tensor
without data, for out-of-range row indices (GET_ROWS/SET_ROWS) and for non-finite values
written to a quantized destination; TypeError for something that is not a tensor.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, NamedTuple

import numpy as np

from ... import types as _types
from ...raw import ffi
from ...core.tensor import op_name
from ..kernel_table import KernelTable, op_id
from .memory import _raw

# ---------------------------------------------------------------------------------------------
# op table


class OpImpl(NamedTuple):
    """One entry of :data:`OPS`: ``supports(ptr) -> bool`` and ``compute(ptr) -> None`` take the
    raw ``struct ggml_tensor *`` of the node; ``notes`` states the types/params handled.
    ``compute`` assumes ``supports`` is true: call the module's :func:`compute`, which checks.

    An op with sub-ops or modes (UNARY, GLU, ROPE, ARGSORT, TRI) names them explicitly:
    ``variant(ptr)`` reads the node's sub-op and ``variants`` is the set its kernel computes,
    checked before ``supports``. A sub-op that a newer ggml adds is therefore not claimed until
    a kernel for it is written."""
    name: str
    supports: Callable[[Any], bool]
    compute: Callable[[Any], None]
    notes: str
    variant: Callable[[Any], int] | None = None
    variants: frozenset[int] = frozenset()


#: GGML_OP_* -> :class:`OpImpl` (a :class:`~pyggml.impl.kernel_table.KernelTable`)
OPS: KernelTable[OpImpl] = KernelTable()


def _add(op_name: str, sup: Callable[[Any], bool], comp: Callable[[Any], None], notes: str, *,
         variant: Callable[[Any], int] | None = None, variants: Iterable[int] = ()) -> None:
    OPS[op_id(op_name)] = OpImpl(op_name, sup, comp, notes, variant, frozenset(int(v) for v in variants))


# ---------------------------------------------------------------------------------------------
# public API


def supports(node: Any) -> bool:
    """True if :func:`compute` computes ``node`` correctly: its op is in :data:`OPS` and the
    op's types, op_params and shapes are ones that kernel handles (see ``OPS[op].notes``).

    ``node``: a :class:`pyggml.Tensor` or a raw ``struct ggml_tensor *``. Only metadata is
    looked at (types, ``ne``, ``nb``, op_params), never the data, so this can be asked before
    the graph is allocated. Never raises for a valid node; TypeError for a non-tensor.
    """
    return OPS.claims(_raw(node))


def compute(node: Any) -> None:
    """Compute ``node`` from its sources (``node.src``) into its own data, in host memory,
    honouring ``node.nb`` (the destination may be a view or non-contiguous). View ops
    (NONE, VIEW, RESHAPE, PERMUTE, TRANSPOSE) do nothing.

    ``node``: a :class:`pyggml.Tensor` or a raw ``struct ggml_tensor *`` whose data and whose
    sources' data are readable/writable host memory. Raises ValueError if
    :func:`supports` is False for it, if a tensor has no data, if a row index is out of range
    (GET_ROWS, SET_ROWS) or if non-finite values are written to a quantized tensor;
    TypeError for a non-tensor.
    """
    p = _raw(node)
    impl = OPS.get(int(p.op))
    if impl is None or not supports(p):
        name = ffi.string(p.name).decode("utf-8", "replace") or "(unnamed)"
        srcs = [_types.type_name(s.type) for s in p.src if s != ffi.NULL]
        raise ValueError(f"the NumPy backend cannot compute node {name} ({op_name(p.op)}, "
                         f"{_types.type_name(p.type)}, srcs {srcs})")
    with np.errstate(all="ignore"):
        impl.compute(p)


def supported_op_names() -> list[str]:
    """The names of the ops in :data:`OPS` (``"ADD"``, ``"MUL_MAT"``...), sorted."""
    return OPS.names()
