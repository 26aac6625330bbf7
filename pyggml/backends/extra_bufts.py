"""A device's extra buffer types (``ggml_backend_dev_get_extra_bufts``): memory in which the
device keeps weights in a layout of its own, for faster matrix products.

ggml's CPU device lists, depending on the machine and the build: ``CPU_REPACK`` (Q4_0, Q4_K,
Q2_K, IQ4_NL and MXFP4 weights re-laid for AVX2/AVX-512 kernels; on Arm and RISC-V also Q8_0 and
others), ``AMX`` (Intel AMX tiles) and ``CPU_KLEIDIAI`` (Arm). llama.cpp places each weight whose
matrix product such a type takes in the first one that does (``--repack``, on by default).

**Trials.** A machine's CPU flags are not proof that ggml's kernels run there (an AMX kernel has
died with SIGILL on a CPU whose flags list AMX). Before pyggml uses an extra buffer type it runs
a trial in a forked child process, once per process: for every weight type the type takes, a
product at 1 and at 16 columns, whose result must match the same product on the device's
default memory. A type whose trial dies or differs is dropped (:func:`trials` says why) and
never used by :meth:`Device.weight_buffer_type <pyggml.backends.device.Device.weight_buffer_type>`.

**What such memory allows.** Its buffers have no ``get_tensor``, and their ``set_tensor``
re-lays a whole tensor: pyggml refuses to read such a tensor, to write part of it or a view of it,
and to write a tensor the type has no layout for (ValueError, before C:
:func:`pyggml.memory.buffer.check_layout`). Only the products the device's ``supports_op``
takes read it; ggml's CPU backend refuses a graph in which another node reads it.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import _trial
from ..core.context import Context
from ..enums import GGMLType
from ..memory.buffer_type import BufferType
from ..raw import ffi, lib
from ..raw.boundary import calling
from .. import types
from .cpu import CPUBackend

__all__ = ["Trial", "listed", "trials", "usable", "weight_buffer_type", "TRIAL_SHAPE"]

#: ne of the weight of a trial product (ggml order): a multiple of every block size and of the
#: row groups of the repacked layouts (4, 8, 16)
TRIAL_SHAPE = (512, 64)
#: columns of the trial products: one (a decode step), several (a batch)
TRIAL_COLUMNS = (1, 16)
#: largest difference to the default memory's product, relative to its largest value (or 1)
TRIAL_RTOL = 1e-3


@dataclass(frozen=True)
class Trial:
    """What the trial of an extra buffer type found: ``types``, the weight types whose product
    the device takes in it; ``error``, why it was dropped (None: proven, in use)."""
    buffer_type: BufferType
    types: tuple[GGMLType, ...]
    error: str | None

    @property
    def name(self) -> str:
        return self.buffer_type.name


_lock = threading.Lock()
_trials: dict[int, list[Trial]] = {}   # device pointer -> its trials, in ggml's order


def listed(dev: Any) -> list[BufferType]:
    """The extra buffer types ggml lists for device pointer ``dev`` (through its registry's
    ``ggml_backend_dev_get_extra_bufts``), untried; [] for a device without any."""
    with calling():
        reg = lib.ggml_backend_dev_backend_reg(dev)
        fn = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
        if fn == ffi.NULL:
            return []
        arr = ffi.cast("ggml_backend_dev_get_extra_bufts_t", fn)(dev)
        out = []
        i = 0
        while arr != ffi.NULL and arr[i] != ffi.NULL:
            out.append(BufferType(arr[i]))
            i += 1
    return out


def _takes(dev: Any, buft: Any, t: int, ne: Sequence[int]) -> bool:
    """Whether ``dev``'s supports_op takes MUL_MAT of a weight of type ``t`` and ``ne`` in
    ``buft`` by float32 activations (llama.cpp's ``weight_buft_supported``: a 0-byte buffer of
    the type stands in for the weight's)."""
    with Context.for_tensors(4) as ctx:
        w = ctx.new_tensor(GGMLType(t), list(ne))
        x = ctx.new_tensor(GGMLType.F32, [ne[0], TRIAL_COLUMNS[-1]])
        op = ctx.mul_mat(w, x)
        with calling():
            dummy = lib.ggml_backend_buft_alloc_buffer(buft, 0)
            if dummy == ffi.NULL:
                return False
            try:
                w.ptr.buffer = dummy
                return bool(lib.ggml_backend_dev_supports_op(dev, op.ptr))
            finally:
                w.ptr.buffer = ffi.NULL
                lib.ggml_backend_buffer_free(dummy)


def _candidates(dev: Any, buft: Any) -> tuple[GGMLType, ...]:
    return tuple(t for t in GGMLType if t < lib.GGML_TYPE_COUNT and types.can_quantize(t)
                 and (t == GGMLType.F32 or lib.ggml_blck_size(t) <= TRIAL_SHAPE[0])
                 and _takes(dev, buft.ptr, t, TRIAL_SHAPE))


def _say(text: str) -> None:
    """A line to the trial's parent (file descriptor 1 of the child: sys.stdout may be another
    file, e.g. under pytest)."""
    os.write(1, (text + "\n").encode())


def _products(buft: BufferType, kinds: tuple[GGMLType, ...]) -> None:
    """The trial itself, in the forked child: each product in ``buft`` and on the CPU's default
    memory; prints ``error: ...`` and exits 1 when they differ. ggml dying is the other answer."""
    cpu = CPUBackend(n_threads=1)   # the OpenMP runtime of the parent does not survive fork()
    rng = np.random.default_rng(0)
    k, n = TRIAL_SHAPE
    for t in kinds:
        _say(f"trying {buft.name} with {t.name} weights")
        values = rng.standard_normal((n, k)).astype(np.float32)
        with Context.for_tensors(1) as wctx, Context.for_tensors(1) as rctx:
            w = wctx.new_tensor(t, [k, n])
            ref = rctx.new_tensor(t, [k, n])
            wctx.alloc_tensors(buft)
            rctx.alloc_tensors(cpu)
            w.set(values)
            ref.set(values)
            for m in TRIAL_COLUMNS:
                with Context.for_tensors(3, graph_size=16) as ctx:
                    x = ctx.new_tensor(GGMLType.F32, [k, m])
                    y, y_ref = ctx.mul_mat(w, x), ctx.mul_mat(ref, x)
                    g = ctx.new_graph(8).build_forward(y).build_forward(y_ref)
                    ctx.alloc_tensors(cpu)
                    x.set(rng.standard_normal((m, k)).astype(np.float32))
                    cpu.graph_compute(g)
                    got, want = y.numpy(), y_ref.numpy()
                diff = float(np.abs(got - want).max())
                if not np.all(np.isfinite(got)) or diff > TRIAL_RTOL * max(float(np.abs(want).max()), 1.0):
                    _say(f"error: {buft.name} computes {t.name} products wrong (largest "
                         f"difference {diff:.3g} at {m} columns)")
                    os._exit(1)


def _run(buft: BufferType, kinds: tuple[GGMLType, ...]) -> str | None:
    """None if the trial of ``buft`` passed, else why not."""
    def child() -> None:
        try:
            _products(buft, kinds)
        except Exception as e:  # noqa: BLE001 - the trial did not prove anything
            _say(f"error: the trial raised {type(e).__name__}: {e}")
            os._exit(1)
    failure = _trial.trial(child, timeout=120)
    if failure is None or failure.startswith("error: "):
        return failure and failure[len("error: "):]
    return f"the trial process died ({failure})"


def trials(dev: Any) -> list[Trial]:
    """The trials of device pointer ``dev``'s extra buffer types, run on first use and kept for
    the process. The trial computes on ggml's CPU backend: another device's extra buffer types
    are listed as not tried, and not used."""
    key = int(ffi.cast("uintptr_t", dev))
    with _lock:
        found = _trials.get(key)
        if found is None:
            found = []
            with calling():
                on_cpu = lib.ggml_backend_dev_type(dev) == lib.GGML_BACKEND_DEVICE_TYPE_CPU
            for buft in listed(dev):
                if not on_cpu:
                    found.append(Trial(buft, (), "not tried: pyggml tries the extra buffer types of CPU devices"))
                    continue
                kinds = _candidates(dev, buft)
                error = _run(buft, kinds) if kinds else "the device takes no weight type's product in it"
                found.append(Trial(buft, kinds, error))
            _trials[key] = found
    return list(found)


def usable(dev: Any) -> list[BufferType]:
    """The extra buffer types of device pointer ``dev`` whose trial passed, in ggml's order."""
    return [t.buffer_type for t in trials(dev) if t.error is None]


def weight_buffer_type(dev: Any, default: BufferType, type: GGMLType, ne: Sequence[int]) -> BufferType:
    """The first usable extra buffer type of ``dev`` whose supports_op takes MUL_MAT of a weight
    of ``type`` and ``ne`` by float32 activations, else ``default``."""
    for buft in usable(dev):
        if _takes(dev, buft.ptr, type, ne):
            return buft
    return default
