"""Every lowering of pyggml.torch_lowering against eager torch.

Each ATen overload of the table has sample calls here (broadcast shapes, non-contiguous views,
numbers as operands, keyword arguments). A sample is traced with ``torch.fx.symbolic_trace`` (the
overloads it calls become the graph's nodes as they are: the test fails unless the graph holds
the overload the sample is for), its fake tensors recorded by ``FakeTensorProp``, computed by
ggml through :class:`~pyggml.torch_lowering.LoweredGraph` and compared with the same function
run by torch.
"""
from __future__ import annotations

import operator
import zlib
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from torch.fx.passes.fake_tensor_prop import FakeTensorProp  # noqa: E402

from pyggml import CPUBackend  # noqa: E402
from pyggml.torch_lowering import TABLE, LoweredGraph, LoweringError, why_not  # noqa: E402

aten = torch.ops.aten


class T:
    """A random float32 input of ``shape`` in [lo, hi); ``perm``: made as another layout and
    permuted (a non-contiguous tensor); ``index``: int64 ids below ``index``."""

    def __init__(self, *shape: int, lo: float = -2.0, hi: float = 2.0, perm: tuple[int, ...] | None = None,
                 index: int = 0, mask: bool = False):
        self.shape, self.lo, self.hi, self.perm, self.index, self.mask = shape, lo, hi, perm, index, mask

    def make(self, rng: np.random.Generator) -> Any:
        if self.mask:   # bool, True = attend; the first key is always attended
            m = rng.random(self.shape) < 0.7
            m[..., 0] = True
            return torch.from_numpy(m)
        if self.index:
            return torch.from_numpy(rng.integers(0, self.index, self.shape))
        if self.perm is None:
            return torch.from_numpy(rng.uniform(self.lo, self.hi, self.shape).astype(np.float32))
        inv = np.argsort(self.perm)
        base = rng.uniform(self.lo, self.hi, tuple(self.shape[i] for i in inv)).astype(np.float32)
        return torch.from_numpy(base).permute(*[int(i) for i in self.perm])


def S(fn: Callable[..., Any], *inputs: T, tol: float = 1e-5) -> tuple[Callable[..., Any], tuple[T, ...], float]:
    return fn, inputs, tol


POS = dict(lo=0.1, hi=3.0)

SAMPLES: dict[Any, list[tuple[Callable[..., Any], tuple[T, ...], float]]] = {
    aten.add.Tensor: [S(lambda x, y: aten.add.Tensor(x, y), T(2, 3), T(3)),
                      S(lambda x, y: aten.add.Tensor(x, y), T(3), T(4, 3)),          # the first broadcast
                      S(lambda x, y: aten.add.Tensor(x, y, alpha=2), T(4, 1, 3), T(5, 1)),
                      S(lambda x: aten.add.Tensor(x, 2.5), T(2, 3, perm=(1, 0))),
                      S(lambda i, j: aten.add.Tensor(i, j), T(2, 3, index=50), T(3, index=9)),   # int64
                      S(lambda i: aten.add.Tensor(i, 1 << 22), T(4, index=1 << 23))],
    aten.add.Scalar: [S(lambda x: aten.add.Scalar(x, 1.5), T(3, 4))],
    aten.sub.Tensor: [S(lambda x, y: aten.sub.Tensor(x, y), T(2, 3), T(2, 1)),
                      S(lambda x, y: aten.sub.Tensor(x, y, alpha=0.5), T(3), T(2, 3)),
                      S(lambda i, j: aten.sub.Tensor(i, j), T(3, 4, index=1000), T(4, index=1000))],   # int64
    aten.sub.Scalar: [S(lambda x: aten.sub.Scalar(x, 0.25), T(5))],
    aten.rsub.Scalar: [S(lambda x: aten.rsub.Scalar(x, 1.0), T(2, 5))],
    aten.rsub.Tensor: [S(lambda x, y: aten.rsub.Tensor(x, y), T(2, 5), T(5))],
    aten.mul.Tensor: [S(lambda x, y: aten.mul.Tensor(x, y), T(2, 3, 4), T(3, 1)),
                      S(lambda x: aten.mul.Tensor(x, 0.125), T(3, 4, perm=(1, 0))),
                      # integers: RoBERTa's positions times its mask (a product of two inputs could leave
                      # float32's exact range and stays in torch)
                      S(lambda m, i: aten.mul.Tensor(aten._to_copy.default(m, dtype=torch.int64), i),
                        T(3, 4, mask=True), T(4, index=100))],
    aten.mul.Scalar: [S(lambda x: aten.mul.Scalar(x, -3.0), T(4))],
    aten.div.Tensor: [S(lambda x, y: aten.div.Tensor(x, y), T(2, 3), T(3, **POS)),
                      S(lambda x: aten.div.Tensor(x, 4.0), T(6))],
    aten.div.Scalar: [S(lambda x: aten.div.Scalar(x, 8.0), T(2, 2))],
    aten.div.Tensor_mode: [S(lambda x, y: aten.div.Tensor_mode(x, y, rounding_mode=None), T(3), T(3, **POS))],
    aten.neg.default: [S(lambda x: aten.neg.default(x), T(2, 3, perm=(1, 0)))],
    aten.abs.default: [S(lambda x: aten.abs.default(x), T(7))],
    aten.exp.default: [S(lambda x: aten.exp.default(x), T(3, 3))],
    aten.log.default: [S(lambda x: aten.log.default(x), T(3, 3, **POS))],
    aten.sqrt.default: [S(lambda x: aten.sqrt.default(x), T(4, **POS))],
    aten.rsqrt.default: [S(lambda x: aten.rsqrt.default(x), T(4, **POS))],
    aten.reciprocal.default: [S(lambda x: aten.reciprocal.default(x), T(2, 4, **POS))],
    aten.sin.default: [S(lambda x: aten.sin.default(x), T(5))],
    aten.cos.default: [S(lambda x: aten.cos.default(x), T(5))],
    aten.tanh.default: [S(lambda x: aten.tanh.default(x), T(5))],
    aten.sigmoid.default: [S(lambda x: aten.sigmoid.default(x), T(5))],
    aten.relu.default: [S(lambda x: aten.relu.default(x), T(4, 4, perm=(1, 0)))],
    aten.silu.default: [S(lambda x: aten.silu.default(x), T(6))],
    aten.sign.default: [S(lambda x: aten.sign.default(x), T(6))],
    aten.sgn.default: [S(lambda x: aten.sgn.default(x), T(6))],
    aten.floor.default: [S(lambda x: aten.floor.default(x), T(6))],
    aten.ceil.default: [S(lambda x: aten.ceil.default(x), T(6))],
    aten.trunc.default: [S(lambda x: aten.trunc.default(x), T(6))],
    aten.expm1.default: [S(lambda x: aten.expm1.default(x), T(6))],
    aten.hardswish.default: [S(lambda x: aten.hardswish.default(x), T(6, lo=-5, hi=5))],
    aten.hardsigmoid.default: [S(lambda x: aten.hardsigmoid.default(x), T(6, lo=-5, hi=5))],
    aten.square.default: [S(lambda x: aten.square.default(x), T(6))],
    aten.gelu.default: [S(lambda x: aten.gelu.default(x), T(3, 8)),
                        S(lambda x: aten.gelu.default(x, approximate="tanh"), T(3, 8, lo=-6.0, hi=6.0))],
    aten.elu.default: [S(lambda x: aten.elu.default(x), T(8))],
    aten.leaky_relu.default: [S(lambda x: aten.leaky_relu.default(x, 0.2), T(8))],
    aten.softplus.default: [S(lambda x: aten.softplus.default(x), T(8))],
    aten.clamp.default: [S(lambda x: aten.clamp.default(x, -0.5, 0.5), T(8)),
                         S(lambda x: aten.clamp.default(x, None, 0.5), T(8))],
    aten.hardtanh.default: [S(lambda x: aten.hardtanh.default(x), T(8)),
                            S(lambda x: aten.hardtanh.default(x, 0.0, 6.0), T(8, lo=-8, hi=8))],
    aten.clamp_min.default: [S(lambda x: aten.clamp_min.default(x, 0.1), T(8))],
    aten.clamp_max.default: [S(lambda x: aten.clamp_max.default(x, 0.1), T(8))],
    aten.pow.Tensor_Scalar: [S(lambda x: aten.pow.Tensor_Scalar(x, e), T(5, **POS)) for e in (0.5, -0.5, -1, 1, 2, 3, 4)],
    # ----------------------------------------------------------------- shape
    aten.view.default: [S(lambda x: aten.view.default(x, [6, 2]), T(3, 4))],
    aten._unsafe_view.default: [S(lambda x: aten._unsafe_view.default(x, [12]), T(3, 4))],
    aten.reshape.default: [S(lambda x: aten.reshape.default(x, [4, 3]), T(3, 4, perm=(1, 0)))],
    aten.unsqueeze.default: [S(lambda x: aten.unsqueeze.default(x, 1), T(3, 4))],
    aten.squeeze.dim: [S(lambda x: aten.squeeze.dim(x, 1), T(3, 1, 4))],
    aten.squeeze.dims: [S(lambda x: aten.squeeze.dims(x, [0, 2]), T(1, 4, 1))],
    aten.squeeze.default: [S(lambda x: aten.squeeze.default(x), T(1, 4, 1))],
    aten.flatten.using_ints: [S(lambda x: aten.flatten.using_ints(x, 1, 2), T(2, 3, 4))],
    aten.unflatten.int: [S(lambda x: aten.unflatten.int(x, 1, [3, 4]), T(2, 12))],
    aten.alias.default: [S(lambda x: aten.mul.Tensor(aten.alias.default(x), 2.0), T(3))],
    aten.detach.default: [S(lambda x: aten.mul.Tensor(aten.detach.default(x), 2.0), T(3))],
    aten.lift_fresh_copy.default: [S(lambda x: aten.mul.Tensor(aten.lift_fresh_copy.default(x), 2.0), T(3))],
    aten.clone.default: [S(lambda x: aten.clone.default(aten.t.default(x)), T(3, 4))],
    aten._to_copy.default: [S(lambda x: aten._to_copy.default(x, dtype=torch.float32), T(3, 4)),
                            S(lambda i: aten._to_copy.default(i, dtype=torch.bool), T(3, 4, index=3)),
                            S(lambda m: aten._to_copy.default(m, dtype=torch.int64), T(3, 4, mask=True)),
                            S(lambda m: aten._to_copy.default(m, dtype=torch.float32), T(3, 4, mask=True)),
                            S(lambda i: aten._to_copy.default(i, dtype=torch.float32), T(3, 4, index=1 << 20))],
    aten.contiguous.default: [S(lambda x: aten.contiguous.default(aten.t.default(x)), T(3, 4))],
    aten.permute.default: [S(lambda x: aten.permute.default(x, [2, 0, 1]), T(2, 3, 4)),
                           S(lambda x: aten.mul.Tensor(aten.permute.default(x, [3, 1, 0, 2]), 1.0), T(2, 3, 4, 5))],
    aten.transpose.int: [S(lambda x: aten.transpose.int(x, 0, 2), T(2, 3, 4))],
    aten.t.default: [S(lambda x: aten.t.default(x), T(3, 5))],
    aten.expand.default: [S(lambda x: aten.expand.default(x, [3, 4, 5]), T(4, 1)),
                          S(lambda x: aten.expand.default(x, [2, -1]), T(1, 6))],
    aten.slice.Tensor: [S(lambda x: aten.slice.Tensor(x, 1, 1, 3), T(3, 5)),
                        S(lambda x: aten.slice.Tensor(x, 0, 1, None, 2), T(7, 3)),
                        S(lambda x: aten.slice.Tensor(x, -1, -3, 100), T(2, 6))],
    aten.select.int: [S(lambda x: aten.select.int(x, 0, 1), T(3, 4)),
                      S(lambda x: aten.select.int(x, 1, -1), T(3, 4, 2)),
                      S(lambda x: aten.select.int(x, 2, 0), T(3, 4, 2))],
    aten.cat.default: [S(lambda x, y: aten.cat.default([x, y], 1), T(2, 3), T(2, 4)),
                       S(lambda x, y, z: aten.cat.default([x, y, z]), T(1, 3), T(2, 3), T(3, 3, perm=(1, 0)))],
    aten.stack.default: [S(lambda x, y: aten.stack.default([x, y], 1), T(2, 3), T(2, 3))],
    # ----------------------------------------------------------------- matrix
    aten.mm.default: [S(lambda x, w: aten.mm.default(x, aten.t.default(w)), T(5, 8), T(6, 8)),
                      S(lambda x, y: aten.mm.default(x, y), T(5, 8), T(8, 3))],
    aten.addmm.default: [S(lambda b, x, w: aten.addmm.default(b, x, aten.t.default(w)), T(6), T(5, 8), T(6, 8)),
                         S(lambda b, x, y: aten.addmm.default(b, x, y, beta=0.5, alpha=2.0), T(5, 3), T(5, 8), T(8, 3))],
    aten.bmm.default: [S(lambda x, y: aten.bmm.default(x, y), T(2, 5, 8), T(2, 8, 3))],
    aten.baddbmm.default: [S(lambda c, x, y: aten.baddbmm.default(c, x, y, beta=0.5, alpha=2.0), T(2, 5, 3),
                             T(2, 5, 8), T(2, 8, 3))],
    aten.matmul.default: [S(lambda x, y: aten.matmul.default(x, y), T(2, 5, 8), T(8, 3))],
    aten.linear.default: [S(lambda x, w, b: aten.linear.default(x, w, b), T(2, 5, 8), T(3, 8), T(3)),
                          S(lambda x, w: aten.linear.default(x, w), T(5, 8), T(3, 8))],
    # ----------------------------------------------------------------- reductions, normalisation
    aten.sum.dim_IntList: [S(lambda x: aten.sum.dim_IntList(x, [1]), T(3, 4, 5)),
                           S(lambda x: aten.sum.dim_IntList(x, [-1], True), T(3, 4)),
                           S(lambda x: aten.sum.dim_IntList(x, [0, 2]), T(3, 4, 5))],
    aten.sum.default: [S(lambda x: aten.sum.default(x), T(3, 4))],
    aten.mean.dim: [S(lambda x: aten.mean.dim(x, [1], True), T(2, 3, 4)),
                    S(lambda x: aten.mean.dim(x, [-1]), T(2, 6))],
    aten.mean.default: [S(lambda x: aten.mean.default(x), T(3, 4))],
    aten._softmax.default: [S(lambda x: aten._softmax.default(x, -1, False), T(2, 3, 7)),
                            S(lambda x: aten._softmax.default(x, 1, False), T(2, 3, 7))],
    aten.softmax.int: [S(lambda x: aten.softmax.int(x, 0), T(4, 3))],
    aten._log_softmax.default: [S(lambda x: aten._log_softmax.default(x, -1, False), T(3, 9))],
    aten.log_softmax.int: [S(lambda x: aten.log_softmax.int(x, 1), T(3, 9))],
    aten.native_layer_norm.default: [
        S(lambda x, w, b: aten.native_layer_norm.default(x, [8], w, b, 1e-5)[0], T(2, 3, 8), T(8), T(8))],
    aten.layer_norm.default: [S(lambda x, w, b: aten.layer_norm.default(x, [8], w, b), T(3, 8), T(8), T(8)),
                              S(lambda x: aten.layer_norm.default(x, [8]), T(3, 8))],
    aten.rms_norm.default: [S(lambda x, w: aten.rms_norm.default(x, [8], w, 1e-6), T(3, 8), T(8))],
    torch.ops.pyggml.rope.default: [S(lambda x, p, f: torch.ops.pyggml.rope.default(x, p, f, 0.8),
                                      T(2, 3, 5, 8), T(1, 5, 1, index=300), T(4, lo=1e-3, hi=1.0), tol=1e-4)],
    operator.getitem: [S(lambda x: aten.native_layer_norm.default(x, [4], None, None, 1e-5)[0], T(2, 4))],
    # ----------------------------------------------------------------- indexing, attention
    aten.embedding.default: [S(lambda w, i: aten.embedding.default(w, i), T(10, 4), T(2, 3, index=10))],
    aten.index_select.default: [S(lambda w, i: aten.index_select.default(w, 0, i), T(10, 4), T(5, index=10))],
    aten.scaled_dot_product_attention.default: [
        S(lambda q, k, v: aten.scaled_dot_product_attention.default(q, k, v), T(2, 3, 5, 8), T(2, 3, 7, 8),
          T(2, 3, 7, 4)),
        S(lambda q, k, v, m: aten.scaled_dot_product_attention.default(q, k, v, m), T(2, 3, 5, 8), T(2, 3, 7, 8),
          T(2, 3, 7, 4), T(2, 1, 1, 7)),
        S(lambda q, k, v: aten.scaled_dot_product_attention.default(q, k, v, is_causal=True, scale=0.3),
          T(1, 2, 6, 8), T(1, 2, 6, 8), T(1, 2, 6, 8)),
        S(lambda q, k, v, m: aten.scaled_dot_product_attention.default(q, k, v, m), T(2, 3, 5, 8), T(2, 3, 7, 8),
          T(2, 3, 7, 4), T(2, 1, 5, 7, mask=True))],
    aten._scaled_dot_product_flash_attention_for_cpu.default: [
        S(lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True)[0],
          T(1, 2, 6, 8), T(1, 2, 6, 8), T(1, 2, 6, 8)),
        S(lambda q, k, v, m: aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, attn_mask=m)[0],
          T(1, 2, 6, 8), T(1, 2, 9, 8), T(1, 2, 9, 8), T(1, 1, 1, 9))],
    # ----------------------------------------------------------------- more element-wise
    aten.maximum.default: [S(lambda x, y: aten.maximum.default(x, y), T(3, 4), T(4))],
    aten.minimum.default: [S(lambda x, y: aten.minimum.default(x, y), T(4), T(3, 4))],
    aten.addcmul.default: [S(lambda x, a, c: aten.addcmul.default(x, a, c, value=0.5), T(3, 4), T(4), T(3, 1))],
    aten.addcdiv.default: [S(lambda x, a, c: aten.addcdiv.default(x, a, c, value=2.0), T(4), T(3, 4), T(3, 4, **POS))],
    aten.lerp.Scalar: [S(lambda x, y: aten.lerp.Scalar(x, y, 0.3), T(3, 4), T(4))],
    aten.log1p.default: [S(lambda x: aten.log1p.default(x), T(5, **POS))],
    aten.log2.default: [S(lambda x: aten.log2.default(x), T(5, **POS))],
    aten.exp2.default: [S(lambda x: aten.exp2.default(x), T(5))],
    aten.mish.default: [S(lambda x: aten.mish.default(x), T(7))],
    aten.selu.default: [S(lambda x: aten.selu.default(x), T(7))],
    aten.tan.default: [S(lambda x: aten.tan.default(x), T(7, lo=-1.2, hi=1.2))],
    aten.logit.default: [S(lambda x: aten.logit.default(x), T(7, lo=0.05, hi=0.95))],
    aten.sinh.default: [S(lambda x: aten.sinh.default(x), T(7))],
    aten.cosh.default: [S(lambda x: aten.cosh.default(x), T(7))],
    aten.frac.default: [S(lambda x: aten.frac.default(x), T(7, lo=-5, hi=5))],
    aten.glu.default: [S(lambda x: aten.glu.default(x, -1), T(3, 8)), S(lambda x: aten.glu.default(x, 0), T(4, 3))],
    # ----------------------------------------------------------------- more shape
    aten.split.Tensor: [S(lambda x: aten.split.Tensor(x, 2, 1)[1], T(3, 5)),
                        S(lambda x: aten.mul.Tensor(aten.split.Tensor(x, 2, 0)[2], 1.0), T(5, 3))],
    aten.split_with_sizes.default: [S(lambda x: aten.split_with_sizes.default(x, [1, 3], -1)[1], T(2, 4))],
    aten.unbind.int: [S(lambda x: aten.unbind.int(x, 1)[2], T(2, 3, 4)), S(lambda x: aten.unbind.int(x, 2)[0], T(2, 3, 4))],
    aten.narrow.default: [S(lambda x: aten.narrow.default(x, 1, 1, 2), T(3, 5)), S(lambda x: aten.narrow.default(x, 0, 0, 2), T(3, 5))],
    aten.repeat_interleave.self_int: [S(lambda x: aten.repeat_interleave.self_int(x, 3, 1), T(2, 2, 5, 4)),
                                      S(lambda x: aten.repeat_interleave.self_int(x, 2, 0), T(3, 4)),
                                      S(lambda x: aten.repeat_interleave.self_int(x, 2, -1), T(3, 4))],
    aten.repeat.default: [S(lambda x: aten.repeat.default(x, [2, 1, 3]), T(3, 2))],
    aten.constant_pad_nd.default: [S(lambda x: aten.constant_pad_nd.default(x, [1, 2, 0, 1]), T(2, 3, 4))],
    aten.view_copy.default: [S(lambda x: aten.view_copy.default(x, [4, 3]), T(3, 4))],
    aten.permute_copy.default: [S(lambda x: aten.permute_copy.default(x, [1, 0]), T(3, 4))],
    aten.t_copy.default: [S(lambda x: aten.t_copy.default(x), T(3, 4))],
    aten.transpose_copy.int: [S(lambda x: aten.transpose_copy.int(x, 0, 1), T(3, 4))],
    aten.unsqueeze_copy.default: [S(lambda x: aten.unsqueeze_copy.default(x, 0), T(3, 4))],
    aten.squeeze_copy.dim: [S(lambda x: aten.squeeze_copy.dim(x, 0), T(1, 4))],
    aten.squeeze_copy.dims: [S(lambda x: aten.squeeze_copy.dims(x, [0]), T(1, 4))],
    aten.expand_copy.default: [S(lambda x: aten.expand_copy.default(x, [2, 4]), T(1, 4))],
    aten.slice_copy.Tensor: [S(lambda x: aten.slice_copy.Tensor(x, 0, 1, 3), T(4, 4))],
    aten.select_copy.int: [S(lambda x: aten.select_copy.int(x, 1, 2), T(4, 4))],
    aten.alias_copy.default: [S(lambda x: aten.alias_copy.default(x), T(4))],
    aten.split_copy.Tensor: [S(lambda x: aten.split_copy.Tensor(x, 2)[1], T(4, 3))],
    aten.split_with_sizes_copy.default: [S(lambda x: aten.split_with_sizes_copy.default(x, [3, 1])[0], T(4, 3))],
    aten.unbind_copy.int: [S(lambda x: aten.unbind_copy.int(x)[1], T(2, 3))],
    # ----------------------------------------------------------------- more reductions, matrix, indexing
    aten.var.correction: [S(lambda x: aten.var.correction(x, [1], correction=1), T(3, 6)),
                          S(lambda x: aten.var.correction(x, [0, 2], correction=0, keepdim=True), T(3, 4, 5))],
    aten.std.correction: [S(lambda x: aten.std.correction(x, [-1], correction=1), T(3, 6))],
    aten.var_mean.correction: [S(lambda x: aten.var_mean.correction(x, [1], correction=0)[1], T(3, 6))],
    aten.cumsum.default: [S(lambda x: aten.cumsum.default(x, 1), T(3, 6)), S(lambda x: aten.cumsum.default(x, 0), T(3, 6)),
                          S(lambda m: aten.cumsum.default(m, 1), T(3, 6, mask=True)),            # bool -> int64
                          S(lambda m: aten.cumsum.default(aten._to_copy.default(m, dtype=torch.int32), 0),
                            T(5, 3, mask=True))],
    aten._native_batch_norm_legit_no_training.default: [
        S(lambda x, w, b, m, v: aten._native_batch_norm_legit_no_training.default(x, w, b, m, v, 0.1, 1e-5)[0],
          T(2, 3, 4, 4), T(3), T(3), T(3), T(3, **POS))],
    aten.mv.default: [S(lambda m, v: aten.mv.default(m, v), T(4, 6), T(6))],
    aten.dot.default: [S(lambda x, y: aten.dot.default(x, y), T(6), T(6))],
    aten.index.Tensor: [S(lambda w, i: aten.index.Tensor(w, [i]), T(8, 3), T(2, 2, index=8)),
                        # an index per dim made from constants: transformers' padding mask[batch, kv]
                        S(lambda m: aten.index.Tensor(m, [aten.unsqueeze.default(aten.arange.default(2), 1),
                                                          aten.sub.Tensor(aten.arange.default(5), 5)]),
                          T(2, 5, mask=True)),
                        S(lambda w: aten.index.Tensor(w, [aten.arange.start_step(3, 0, -1), aten.arange.default(3)]),
                          T(4, 3))],
    # one row index (two could repeat, where torch leaves the order open): a KV cache's update
    aten.index_put.default: [S(lambda x, i, v: aten.index_put.default(x, [None, None, i], v),
                               T(1, 3, 6, 4), T(1, index=6), T(1, 3, 1, 4)),
                             S(lambda x, i, v: aten.index_put.default(x, [i], v), T(6, 4), T(1, index=6),
                               T(1, 4, perm=(0, 1)))],
    # ----------------------------------------------------------------- composites
    aten.log10.default: [S(lambda x: aten.log10.default(x), T(3, 4, **POS))],
    aten.celu.default: [S(lambda x: aten.celu.default(x, 0.5), T(3, 5)), S(lambda x: aten.celu.default(x), T(6))],
    aten.pow.Scalar: [S(lambda x: aten.pow.Scalar(2.5, x), T(3, 4))],
    aten.lerp.Tensor: [S(lambda x, y, w: aten.lerp.Tensor(x, y, w), T(2, 3), T(3), T(2, 1, lo=0.0, hi=1.0))],
    aten.hypot.default: [S(lambda x, y: aten.hypot.default(x, y), T(2, 3), T(3))],
    aten.logaddexp.default: [S(lambda x, y: aten.logaddexp.default(x, y), T(2, 3, lo=-30, hi=30), T(3))],
    aten.deg2rad.default: [S(lambda x: aten.deg2rad.default(x), T(4, lo=-360, hi=360))],
    aten.rad2deg.default: [S(lambda x: aten.rad2deg.default(x), T(4), tol=1e-4)],
    aten.relu6.default: [S(lambda x: aten.relu6.default(x), T(3, 5, lo=-3, hi=9))],
    aten.prelu.default: [S(lambda x, w: aten.prelu.default(x, w), T(2, 3, 5), T(3)),
                         S(lambda x, w: aten.prelu.default(x, w), T(4, 3), T(1))],
    aten.native_group_norm.default: [
        S(lambda x, w, b: aten.native_group_norm.default(x, w, b, 2, 6, 20, 3, 1e-5)[0], T(2, 6, 4, 5), T(6), T(6),
          tol=1e-4)],
    aten.group_norm.default: [S(lambda x, w, b: aten.group_norm.default(x, 2, w, b, 1e-5), T(3, 4, 7), T(4), T(4),
                                tol=1e-4),
                              S(lambda x: aten.group_norm.default(x, 1), T(2, 3), tol=1e-4)],
    aten.linalg_vector_norm.default: [S(lambda x: aten.linalg_vector_norm.default(x), T(3, 4)),
                                      S(lambda x: aten.linalg_vector_norm.default(x, 2, [-1], True), T(2, 3, 5))],
    aten.roll.default: [S(lambda x: aten.roll.default(x, [1, -2], [0, 2]), T(3, 2, 5)),
                        S(lambda x: aten.roll.default(x, [7], [1]), T(2, 4))],
    aten.triu.default: [S(lambda x: aten.triu.default(x), T(4, 4)), S(lambda x: aten.triu.default(x, 1), T(2, 5, 5))],
    aten.tril.default: [S(lambda x: aten.tril.default(x), T(3, 3, perm=(1, 0))),
                        S(lambda x: aten.tril.default(x, -1), T(2, 5, 5))],
    aten.reflection_pad1d.default: [S(lambda x: aten.reflection_pad1d.default(x, [2, 3]), T(2, 3, 6))],
    aten.narrow_copy.default: [S(lambda x: aten.narrow_copy.default(x, 1, 1, 3), T(2, 5))],
    aten.swapaxes.default: [S(lambda x: aten.swapaxes.default(x, 0, 2), T(2, 3, 4))],
    aten.swapdims.default: [S(lambda x: aten.swapdims.default(x, -1, 0), T(2, 3))],
    aten.ravel.default: [S(lambda x: aten.ravel.default(x), T(3, 4, perm=(1, 0)))],
    aten.copy.default: [S(lambda x, y: aten.copy.default(x, y), T(2, 3), T(3))],
    aten.fill.Scalar: [S(lambda x: aten.fill.Scalar(x, 1.5), T(2, 3))],
    aten.fill.Tensor: [S(lambda x, v: aten.fill.Tensor(x, v), T(2, 3), T())],
    aten.clamp.Tensor: [S(lambda x, lo, hi: aten.clamp.Tensor(x, lo, hi), T(2, 3), T(3, lo=-1, hi=0), T(2, 1, lo=0, hi=1)),
                        S(lambda x, lo: aten.clamp.Tensor(x, lo), T(4), T(4))],
    aten.log_sigmoid_forward.default: [S(lambda x: aten.log_sigmoid_forward.default(x)[0], T(3, 4, lo=-20, hi=20))],
    aten.std_mean.correction: [S(lambda x: aten.std_mean.correction(x, [1], correction=1)[0], T(3, 5)),
                               S(lambda x: aten.std_mean.correction(x, [0], keepdim=True)[1], T(4, 2))],
    aten.slice_scatter.default: [S(lambda x, s: aten.slice_scatter.default(x, s, 1, 2, 5), T(3, 6), T(3, 3)),
                                 S(lambda x, s: aten.slice_scatter.default(x, s, 0, -2), T(4, 2, 3), T(2, 2, 3))],
    aten.select_scatter.default: [S(lambda x, s: aten.select_scatter.default(x, s, 1, -1), T(2, 4, 3), T(2, 3))],
    # ----------------------------------------------------------------- convolution, pooling, resizing
    aten.convolution.default: [
        S(lambda x, w, b: aten.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
          T(2, 3, 8, 7), T(4, 3, 3, 3), T(4), tol=1e-4),
        S(lambda x, w: aten.convolution.default(x, w, None, [2, 1], [0, 2], [1, 2], False, [0, 0], 1),
          T(1, 2, 9, 8), T(3, 2, 3, 2), tol=1e-4),
        S(lambda x, w, b: aten.convolution.default(x, w, b, [2], [1], [1], False, [0], 1),
          T(2, 3, 11), T(5, 3, 3), T(5), tol=1e-4)],
    aten.max_pool2d_with_indices.default: [
        S(lambda x: aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2])[0], T(2, 3, 8, 6)),
        S(lambda x: aten.max_pool2d_with_indices.default(x, [3, 2], [1, 2])[0], T(1, 2, 7, 6))],
    aten.avg_pool2d.default: [S(lambda x: aten.avg_pool2d.default(x, [2, 2], [2, 2]), T(2, 3, 8, 6))],
    aten._adaptive_avg_pool2d.default: [S(lambda x: aten._adaptive_avg_pool2d.default(x, [1, 1]), T(2, 3, 4, 6)),
                                        S(lambda x: aten._adaptive_avg_pool2d.default(x, [2, 3]), T(1, 2, 4, 6))],
    aten.upsample_nearest2d.vec: [S(lambda x: aten.upsample_nearest2d.vec(x, [6, 4], None), T(1, 2, 3, 2))],
    aten.upsample_nearest2d.default: [S(lambda x: aten.upsample_nearest2d.default(x, [4, 6]), T(1, 2, 2, 3))],
    # ----------------------------------------------------------------- shrinkage, steps, extremes
    aten.softshrink.default: [S(lambda x: aten.softshrink.default(x, 0.5), T(4, 6))],
    aten.hardshrink.default: [S(lambda x: aten.hardshrink.default(x, 0.3), T(4, 6))],
    aten.threshold.default: [S(lambda x: aten.threshold.default(x, 0.1, -2.0), T(4, 6))],
    aten.heaviside.default: [S(lambda x, v: aten.heaviside.default(aten.trunc.default(x), v),
                               T(3, 5, lo=-3.0, hi=3.0), T(5))],
    aten.where.self: [   # a bool mask to an additive one (infinities exact), and two finite numbers
        S(lambda m: aten.where.self(m, aten.scalar_tensor.default(0.0), aten.scalar_tensor.default(float("-inf"))),
          T(2, 1, 3, 5, mask=True)),
        S(lambda m: aten.where.self(m, aten.scalar_tensor.default(1.5), aten.scalar_tensor.default(-3.0)),
          T(4, 6, mask=True))],
    # comparisons and logic (integers and bools, F32 0/1 in ggml): _LOGIC_SAMPLES, below
    aten.bitwise_not.default: [S(lambda m: aten.bitwise_not.default(m), T(3, 4, mask=True))],
    aten.logical_not.default: [S(lambda m: aten.logical_not.default(m), T(2, 3, 4, mask=True))],
    aten.clamp_min.Tensor: [S(lambda x, y: aten.clamp_min.Tensor(x, y), T(3, 4), T(4))],
    aten.clamp_max.Tensor: [S(lambda x, y: aten.clamp_max.Tensor(x, y), T(3, 4), T(3, 1))],
    aten.amax.default: [S(lambda x: aten.amax.default(x, [1]), T(3, 4, 5)),
                        S(lambda x: aten.amax.default(x, [0, 2], True), T(3, 4, 5, perm=(2, 0, 1)))],
    aten.amin.default: [S(lambda x: aten.amin.default(x, [-1]), T(2, 6)),
                        S(lambda x: aten.amin.default(x), T(2, 3, 4))],
    aten.max.default: [S(lambda x: aten.max.default(x), T(3, 4))],
    aten.min.default: [S(lambda x: aten.min.default(x), T(3, 4, 2))],
    aten.max.dim: [S(lambda x: aten.max.dim(x, 1)[0], T(3, 4, 2))],
    aten.min.dim: [S(lambda x: aten.min.dim(x, 0, True)[0], T(3, 4))],
    aten.aminmax.default: [S(lambda x: aten.aminmax.default(x, dim=1)[1], T(3, 4)),
                           S(lambda x: aten.aminmax.default(x)[0], T(2, 5))],
    aten.flip.default: [S(lambda x: aten.flip.default(x, [0, 2]), T(2, 3, 4)),
                        S(lambda x: aten.flip.default(x, [-1]), T(5, 3)),
                        S(lambda x: aten.flip.default(x, [1]), T(2, 3, 4, 2))],
    aten.gather.default: [S(lambda x, i: aten.gather.default(x, 1, i), T(3, 5), T(3, 4, index=5)),
                          S(lambda x, i: aten.gather.default(x, 0, i), T(4, 3), T(6, 3, index=4)),
                          S(lambda x, i: aten.gather.default(x, 1, i), T(2, 5, 3), T(2, 2, 3, index=5))],
    aten.reflection_pad2d.default: [S(lambda x: aten.reflection_pad2d.default(x, [1, 2, 2, 1]), T(1, 2, 4, 5))],
    aten.upsample_nearest1d.vec: [S(lambda x: aten.upsample_nearest1d.vec(x, [6], None), T(1, 2, 3))],
    aten.upsample_nearest1d.default: [S(lambda x: aten.upsample_nearest1d.default(x, [9]), T(2, 2, 3))],
    # ----------------------------------------------------------------- constants
    aten.arange.default: [S(lambda x: aten.add.Tensor(x, aten.arange.default(5, dtype=torch.float32)), T(2, 5))],
    aten.arange.start: [S(lambda x: aten.add.Tensor(x, aten.arange.start(2, 7, dtype=torch.float32)), T(5))],
    aten.arange.start_step: [S(lambda x: aten.add.Tensor(x, aten.arange.start_step(0, 1, 0.25, dtype=torch.float32)), T(4))],
    aten.full.default: [S(lambda x: aten.mul.Tensor(x, aten.full.default([3], 2.5)), T(2, 3))],
    aten.zeros.default: [S(lambda x: aten.add.Tensor(x, aten.zeros.default([3])), T(3))],
    aten.ones.default: [S(lambda x: aten.add.Tensor(x, aten.ones.default([3])), T(3))],
    aten.scalar_tensor.default: [S(lambda x: aten.mul.Tensor(x, aten.scalar_tensor.default(3.0)), T(3))],
    aten.linspace.default: [S(lambda x: aten.add.Tensor(x, aten.linspace.default(0, 1, 4)), T(4))],
    aten.eye.default: [S(lambda x: aten.add.Tensor(x, aten.eye.default(3)), T(3, 3))],
    aten.full_like.default: [S(lambda x: aten.add.Tensor(x, aten.full_like.default(x, 0.5)), T(2, 3))],
    aten.zeros_like.default: [S(lambda x: aten.add.Tensor(x, aten.zeros_like.default(x)), T(2, 3))],
    aten.ones_like.default: [S(lambda x: aten.add.Tensor(x, aten.ones_like.default(x)), T(2, 3))],
    aten.new_zeros.default: [S(lambda x: aten.add.Tensor(x, aten.new_zeros.default(x, [3])), T(2, 3))],
    aten.new_ones.default: [S(lambda x: aten.add.Tensor(x, aten.new_ones.default(x, [3])), T(2, 3))],
    aten.new_full.default: [S(lambda x: aten.add.Tensor(x, aten.new_full.default(x, [3], 4.0)), T(2, 3))],
}


def _comparison(op: Any) -> dict[Any, list[tuple[Callable[..., Any], tuple[T, ...], float]]]:
    """Samples of a comparison: small integers (one broadcast) and bools."""
    return {op.Scalar: [S(lambda i: op.Scalar(i, 3), T(4, 5, index=7))],
            op.Tensor: [S(lambda i, j: op.Tensor(i, j), T(4, 5, index=4), T(5, index=4)),
                        S(lambda m, n: op.Tensor(m, n), T(3, 4, mask=True), T(3, 4, mask=True))]}


def _logical(op: Any) -> list[tuple[Callable[..., Any], tuple[T, ...], float]]:
    """Samples of a logical op: bools, one broadcast."""
    return [S(lambda m, n: op(m, n), T(3, 4, mask=True), T(4, mask=True))]


for _op in (aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge):
    SAMPLES.update(_comparison(_op))
for _logic in (aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor, aten.logical_and.default,
               aten.logical_or.default, aten.logical_xor.default):
    SAMPLES[_logic] = _logical(_logic)


CASES = [pytest.param(target, i, id=f"{target}-{i}") for target, samples in SAMPLES.items()
         for i in range(len(samples))]


def trace(fn: Callable[..., Any], inputs: list[Any], target: Any) -> Any:
    """``fn``'s calls as FX nodes, with the fake tensors of their results in ``meta["val"]``
    (``make_fx`` for the calls FX's symbolic tracing computes at once: those of constants only,
    which then are missing or constants of the module)."""
    gm = torch.fx.symbolic_trace(fn)
    computed = any(n.op == "get_attr" for n in gm.graph.nodes)
    if computed or target not in {n.target for n in gm.graph.nodes}:
        return make_fx(fn)(*inputs)
    FakeTensorProp(gm).propagate(*inputs)
    return gm


@pytest.fixture(scope="module")
def cpu():
    with CPUBackend(n_threads=1) as be:
        yield be


def test_every_lowering_has_notes_and_samples():
    assert len(TABLE) >= 87
    assert not [str(t) for t, low in TABLE.items() if not low.notes.strip()]
    assert sorted(map(str, set(TABLE) - set(SAMPLES))) == []


@pytest.mark.parametrize("target, i", CASES)
def test_lowering_matches_eager_torch(cpu, target, i):
    fn, specs, tol = SAMPLES[target][i]
    rng = np.random.default_rng(zlib.crc32(f"{target}-{i}".encode()))
    inputs = [s.make(rng) for s in specs]
    gm = trace(fn, inputs, target)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert target in targets, f"the sample traces to {targets}, not {target}"
    for n in gm.graph.nodes:
        if n.op == "call_function":
            assert why_not(n) is None, f"{n.format_node()}: {why_not(n)}"
    lowered = LoweredGraph(gm, set(), backend=cpu)
    try:
        got = lowered(*inputs)
    finally:
        lowered.close()
    want = fn(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=tol, atol=tol)


def test_what_ggml_cannot_take_is_said_not_lowered(cpu):
    """A node outside the table, a dtype ggml is not given and a dim too many are refused by
    why_not with the reason, and LoweredGraph raises LoweringError before building anything."""
    cases = [
        (lambda x: aten.erf.default(x), [torch.randn(3)], "has no lowering"),
        (lambda x: aten.mul.Tensor(x, x), [torch.randn(3, dtype=torch.float64)], "dtype torch.float64"),
        (lambda x: aten.relu.default(x), [torch.randn(1, 2, 1, 2, 1)], "5 dims"),
        (lambda x: aten.pow.Tensor_Scalar(x, 1.7), [torch.rand(3)], "exponent 1.7"),
        (lambda x: aten.slice.Tensor(x, 1, 0, 4, 2), [torch.randn(3, 4)], "a step along the last dim"),
    ]
    for fn, inputs, reason in cases:
        gm = make_fx(fn)(*inputs)
        node = next(n for n in gm.graph.nodes if n.op == "call_function")
        assert reason in (why_not(node) or ""), (why_not(node), reason)
        with pytest.raises(LoweringError, match=reason):
            LoweredGraph(gm, set(), backend=cpu)


def test_a_graph_is_built_once_per_input_shape(cpu):
    gm = make_fx(lambda x, y: aten.add.Tensor(aten.mul.Tensor(x, 2.0), y))(torch.randn(2, 3), torch.randn(3))
    lowered = LoweredGraph(gm, set(), backend=cpu)
    try:
        for rows in (2, 5, 2, 5, 2):
            x, y = torch.randn(rows, 3), torch.randn(3)
            np.testing.assert_allclose(lowered(x, y)[0].numpy(), (x * 2 + y).numpy(), rtol=1e-6)
        assert lowered.graphs_built == 2
    finally:
        lowered.close()


def test_the_docs_table_is_current():
    import subprocess
    import sys
    from conftest import ROOT
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "torch_lowering_table.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_row_index_out_of_range_is_a_value_error(cpu):
    """index_put's rows are checked before ggml computes (ggml_set_rows would abort): ValueError."""
    gm = make_fx(lambda x, i, v: aten.index_put.default(x, [i], v))(torch.zeros(6, 4), torch.tensor([2]),
                                                                     torch.ones(1, 4))
    lowered = LoweredGraph(gm, set(), backend=cpu)
    try:
        assert float(lowered(torch.zeros(6, 4), torch.tensor([5]), torch.ones(1, 4))[0][5].sum()) == 4.0
        with pytest.raises(ValueError, match="row index 6"):
            lowered(torch.zeros(6, 4), torch.tensor([6]), torch.ones(1, 4))
    finally:
        lowered.close()


@pytest.mark.parametrize("op", ["embedding", "index", "index_put", "gather"])
def test_an_int64_index_beyond_int32_is_a_value_error(cpu, op):
    """ggml's indices are int32: an int64 index past int32's range used to be truncated into a
    valid one (1 << 40 became 0, and nn.Embedding(10, 8) returned row 0; eager torch raises
    IndexError). Each lowering that takes indices refuses it before computing: ValueError, and
    in-range int64 indices still give eager's result."""
    table = torch.arange(40.0).reshape(10, 4)
    ok, bad = torch.tensor([[1, 2, 9]]), torch.tensor([[1, 2, 1 << 40]])
    fn = {"embedding": lambda w, i: aten.embedding.default(w, i),
          "index": lambda w, i: aten.index.Tensor(w, [i]),
          "index_put": lambda w, i: aten.index_put.default(w, [i], torch.ones(3, 4)),
          "gather": lambda w, i: aten.gather.default(w, 0, i)}[op]
    if op == "index_put":   # rows of one dimension
        ok, bad = ok[0], bad[0]
    if op == "gather":      # an index per element: (3, 4)
        ok, bad = ok.T.expand(3, 4).contiguous(), bad.T.expand(3, 4).contiguous()
    gm = make_fx(fn)(table, ok)
    lowered = LoweredGraph(gm, set(), backend=cpu)
    try:
        torch.testing.assert_close(lowered(table, ok)[0], fn(table, ok))
        for idx in (bad, -bad):
            with pytest.raises(ValueError, match="outside the int32 range"):
                lowered(table, idx)
        torch.testing.assert_close(lowered(table, ok)[0], fn(table, ok))   # nothing left broken
    finally:
        lowered.close()


def test_a_one_element_int64_index_beyond_int32_is_a_value_error(cpu):
    """An index tensor of one element (a decode step's token id) is read as one number: the
    same int32 range check, and int32's extremes are in range."""
    table = torch.arange(40.0).reshape(10, 4)
    fn = lambda w, i: aten.index.Tensor(w, [i])  # noqa: E731
    gm = make_fx(fn)(table, torch.tensor([3]))
    lowered = LoweredGraph(gm, set(), backend=cpu)
    try:
        torch.testing.assert_close(lowered(table, torch.tensor([3]))[0], table[[3]])
        for bad in (1 << 40, -(1 << 40), 2**31, -(2**31) - 1):
            with pytest.raises(ValueError, match="outside the int32 range"):
                lowered(table, torch.tensor([bad]))
        torch.testing.assert_close(lowered(table, torch.tensor([9]))[0], table[[9]])
    finally:
        lowered.close()


def test_a_gather_index_past_the_dim_is_a_value_error(cpu):
    """An index of gather past its dim (or negative) is refused before ggml reads there, as
    eager torch refuses it; the graph computes right afterwards."""
    x = torch.arange(12.0).reshape(3, 4)
    fn = lambda w, i: aten.gather.default(w, 1, i)  # noqa: E731
    ok = torch.tensor([[3, 0], [1, 1], [2, 0]])
    gm = make_fx(fn)(x, ok)
    lowered = LoweredGraph(gm, set(), backend=cpu)
    try:
        for bad in (torch.tensor([[4, 0], [1, 1], [2, 0]]), torch.tensor([[0, 0], [-1, 1], [2, 0]])):
            with pytest.raises(ValueError, match="row index"):
                lowered(x, bad)
        torch.testing.assert_close(lowered(x, ok)[0], fn(x, ok))
    finally:
        lowered.close()
