"""pyggml.enums: real IntEnum classes generated from the headers, equal to lib's constants, and
used for what ggml returns."""
from __future__ import annotations

import enum

import numpy as np
import pytest

import pyggml
from pyggml import enums, lib
from pyggml.enums import BufferUsage, DeviceType, GGMLType, Op, member

# C prefix of each class's members (the generator's own table is build-time only)
PREFIXES = {"GGMLType": "GGML_TYPE_", "Op": "GGML_OP_", "UnaryOp": "GGML_UNARY_OP_",
            "GLUOp": "GGML_GLU_OP_", "Status": "GGML_STATUS_", "LogLevel": "GGML_LOG_LEVEL_",
            "TensorFlag": "GGML_TENSOR_FLAG_", "BufferUsage": "GGML_BACKEND_BUFFER_USAGE_",
            "DeviceType": "GGML_BACKEND_DEVICE_TYPE_", "GGUFValueType": "GGUF_TYPE_",
            "RopeType": "GGML_ROPE_TYPE_", "SortOrder": "GGML_SORT_ORDER_", "PoolOp": "GGML_OP_POOL_",
            "OptimizerType": "GGML_OPT_OPTIMIZER_TYPE_", "OptLossType": "GGML_OPT_LOSS_TYPE_"}


@pytest.mark.parametrize("name", sorted(PREFIXES))
def test_every_member_is_libs_constant_and_every_constant_a_member(name):
    cls = getattr(enums, name)
    assert issubclass(cls, (enum.IntEnum, enum.IntFlag))
    prefix = PREFIXES[name]
    for m in cls:
        assert int(m) == getattr(lib, prefix + m.name), m
    names = {n[len(prefix):] for n in dir(lib) if n.startswith(prefix) and not n.endswith("_COUNT")}
    if name == "Op":  # GGML_OP_POOL_MAX/AVG belong to enum ggml_op_pool, whose prefix overlaps
        names -= {"POOL_" + n for n in enums.PoolOp.__members__}
    if name == "PoolOp":  # and GGML_OP_POOL_1D... to enum ggml_op
        names = {n for n in names if "POOL_" + n not in Op.__members__}
    assert names == set(cls.__members__), names ^ set(cls.__members__)


def test_member_accepts_members_ints_and_names():
    assert member(DeviceType, "gpu") is DeviceType.GPU
    assert member(BufferUsage, int(BufferUsage.WEIGHTS)) is BufferUsage.WEIGHTS
    with pytest.raises(ValueError, match="is not a DeviceType"):
        member(DeviceType, "tpu")
    with pytest.raises(TypeError):
        member(DeviceType, True)


def test_ggml_values_come_back_as_members():
    with pyggml.Context(1 << 20) as ctx:
        t = ctx.from_numpy(np.ones(4, np.float32))
        y = ctx.sqr(t)
        assert t.type is GGMLType.F32 and y.op is Op.SQR and t.op is Op.NONE
    cpu = pyggml.backends.device.device_by_name("CPU")  # devices()[0] is a GPU in GPU builds
    assert cpu.type is DeviceType.CPU
    assert all(isinstance(d.type, DeviceType) for d in pyggml.devices())
