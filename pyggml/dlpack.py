"""DLPack: ggml tensors shared with NumPy, torch, JAX, CuPy... without a copy.

:meth:`Tensor.__dlpack__ <pyggml.core.tensor.Tensor.__dlpack__>` hands another library a
``DLManagedTensorVersioned`` (DLPack 1.0, to consumers that ask for it with ``max_version``) or a
``DLManagedTensor`` (the DLPack 0.8 "dltensor" capsule older consumers take) describing the
tensor's memory: host memory as ``kDLCPU``, memory of a CUDA buffer as ``kDLCUDA`` with the
device's index. The capsule keeps what owns the memory alive (the context and the buffer) until
the consumer calls the deleter, so the tensor's context or buffer may be closed while the other
library still uses the memory: it is freed once the last user lets go, as for
``Tensor.numpy(copy=False)``.

This module knows only DLPack's C structs (``dlpack.h``, v1.0, declared here with ctypes: DLPack
is not part of ggml's headers) and how to make the capsule; :mod:`pyggml.core.tensor` decides what
may be exported, and :func:`pyggml.backends.utils.from_dlpack` imports.
"""
from __future__ import annotations

import ctypes
import enum
from typing import Any, Sequence

from .enums import GGMLType


class DLDeviceType(enum.IntEnum):
    """``DLDeviceType`` of dlpack.h (the values pyggml can meet)."""

    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    VULKAN = 7
    METAL = 8
    ROCM = 10


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    pass


_DELETER_V = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensorVersioned))
_DLManagedTensorVersioned._fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                                      ("deleter", _DELETER_V), ("flags", ctypes.c_uint64),
                                      ("dl_tensor", _DLTensor)]

#: DLDataTypeCode per ggml type: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4 (lanes 1)
DTYPES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (2, 32), GGMLType.F16: (2, 16), GGMLType.F64: (2, 64), GGMLType.BF16: (4, 16),
    GGMLType.I8: (0, 8), GGMLType.I16: (0, 16), GGMLType.I32: (0, 32), GGMLType.I64: (0, 64),
}

#: (capsule name, its name once taken) of DLPack 0.8 and of DLPack 1.0 (versioned)
_NAMES = {False: (b"dltensor", b"used_dltensor"), True: (b"dltensor_versioned", b"used_dltensor_versioned")}

# what each exported DLManagedTensor keeps alive, by its address; its deleter drops the entry
_EXPORTED: dict[int, tuple[Any, ...]] = {}

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_get_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_get_name.restype = ctypes.c_char_p
_capsule_get_name.argtypes = [ctypes.c_void_p]
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


def _deleter(managed: Any) -> None:
    """The consumer is done with the memory: let go of its owners."""
    _EXPORTED.pop(ctypes.addressof(managed.contents), None)


_DELETER_FN = _DELETER(_deleter)
_DELETER_V_FN = _DELETER_V(_deleter)


def _capsule_destructor_py(capsule: int) -> None:
    """A capsule no consumer took (still named "dltensor"/"dltensor_versioned"): let go
    ourselves. A taken one is renamed "used_..." and its consumer calls the deleter."""
    name = _capsule_get_name(capsule)
    if name in (_NAMES[False][0], _NAMES[True][0]):
        addr = _capsule_get_pointer(capsule, name)
        if addr:
            _EXPORTED.pop(addr, None)


_capsule_destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_capsule_destructor_py)


class Lent:
    """What an exported tensor's memory belongs to (its context, its buffer), held until the
    consumer lets go: each owner counts it as a view of its memory (``CObject._export``)."""

    __slots__ = ("owners", "__weakref__")

    def __init__(self, owners: list[Any]):
        self.owners = owners


def capsule(data: int, shape: Sequence[int], strides: Sequence[int], type: GGMLType,
            device: tuple[int, int], keep: Any, versioned: bool = False) -> Any:
    """A DLPack PyCapsule for the memory at address ``data``: NumPy-order ``shape`` and
    ``strides`` (in elements, as DLPack counts them), ggml ``type`` (a plain type of
    :data:`DTYPES`), ``device`` = (DLDeviceType, device index); a DLPack 1.0
    "dltensor_versioned" capsule (writable) if ``versioned``, else a DLPack 0.8 "dltensor" one.
    ``keep`` stays alive until the consumer calls the deleter (or the capsule is dropped
    untaken). Raises BufferError for a type DLPack cannot describe (quantized types)."""
    if type not in DTYPES:
        raise BufferError(f"DLPack has no dtype for ggml type {type.name}: dequantize first "
                          "(Tensor.numpy() or Context.cast)")
    n = len(shape)
    shape_arr = (ctypes.c_int64 * max(n, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(n, 1))(*strides)
    code, bits = DTYPES[type]
    tensor = _DLTensor(data, _DLDevice(*device), n, _DLDataType(code, bits, 1), shape_arr, strides_arr, 0)
    managed: Any
    if versioned:
        managed = _DLManagedTensorVersioned(_DLPackVersion(1, 0), None, _DELETER_V_FN, 0, tensor)
    else:
        managed = _DLManagedTensor(tensor, None, _DELETER_FN)
    addr = ctypes.addressof(managed)
    _EXPORTED[addr] = (managed, shape_arr, strides_arr, keep)
    return _capsule_new(addr, _NAMES[versioned][0], ctypes.cast(_capsule_destructor, ctypes.c_void_p))


def n_exported() -> int:
    """How many exported DLPack tensors are still held by a consumer (for leak tests)."""
    return len(_EXPORTED)
