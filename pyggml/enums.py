"""ggml's enums as Python ``IntEnum`` classes, used everywhere in pyggml.

The classes are generated at build time from the pinned headers (``pyggml/_enums.py``, written
by ``pyggml_build/declarations.py``), so they are real classes that type checkers and editors
see, and they hold exactly the values of the ggml that was built. Members are named as in C
without the prefix; each is an ``int`` and compares equal to ``lib``'s constant::

    GGMLType.Q4_K == lib.GGML_TYPE_Q4_K          # ggml_type
    Op.MUL_MAT == lib.GGML_OP_MUL_MAT            # ggml_op
    UnaryOp.GELU, GLUOp.SWIGLU                   # ggml_unary_op, ggml_glu_op
    Status.FAILED, LogLevel.WARN                 # ggml_status, ggml_log_level
    DeviceType.GPU, BufferUsage.WEIGHTS          # ggml_backend_dev_type, ggml_backend_buffer_usage
    TensorFlag.INPUT | TensorFlag.OUTPUT         # ggml_tensor_flag (an IntFlag)
    GGUFValueType.STRING                         # gguf_type
    RopeType.NEOX                                # the GGML_ROPE_TYPE_* macros

pyggml returns these classes wherever ggml returns an enum value (``Tensor.type`` is a
:class:`GGMLType`, ``Tensor.op`` an :class:`Op`, ``Device.type`` a :class:`DeviceType`) and
accepts them, plain ints or (where it says so) names.
"""
from __future__ import annotations

from enum import IntEnum
from typing import TypeVar

from ._enums import *  # noqa: F403  (the generated classes)
from ._enums import __all__ as _generated

__all__ = list(_generated) + ["member", "name_of"]

E = TypeVar("E", bound=IntEnum)


def member(cls: type[E], value: int | str | E) -> E:
    """``value`` as a member of ``cls``: a member, its int value, or its name in any case
    (``member(DeviceType, "gpu")``). Raises ValueError for a value or name ``cls`` lacks,
    TypeError for anything else (bool included)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            return cls[value.upper()]
        except KeyError:
            raise ValueError(f"{value!r} is not a {cls.__name__} (one of "
                             f"{', '.join(m.name.lower() for m in cls)})") from None
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{value} is not a {cls.__name__} value") from None
    raise TypeError(f"a {cls.__name__} must be a member, an int or a name, not {type(value).__name__}")


def name_of(cls: type[IntEnum], value: int) -> str:
    """The lower-case member name of ``value`` in ``cls`` (``"gpu"``), or ``str(value)`` for a
    value the built headers do not name."""
    try:
        return cls(value).name.lower()
    except ValueError:
        return str(value)
