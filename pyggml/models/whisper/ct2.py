"""CTranslate2's model file (``model.bin``, as ``ctranslate2.specs.model_spec`` writes it): its
variables as NumPy arrays, read without CTranslate2.

Layout (little-endian): u32 version, the spec's name, u32 revision, u32 variable count; per
variable its name, u8 rank, u32 dims[rank], u8 dtype, u32 byte count and the data; then u32 alias
count and (alias, target) name pairs. A name is a u16 length (the NUL included), the bytes and
the NUL.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..common import ModelError

__all__ = ["read_ct2"]

#: CTranslate2's dtype codes
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


class _Reader:
    def __init__(self, path: Path, data: memoryview):
        self.path, self.data, self.pos = path, data, 0

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise ModelError(f"{self.path}: truncated CTranslate2 model file (at byte {self.pos})")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u(self, fmt: str) -> int:
        (v,) = struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))
        return int(v)

    def name(self) -> str:
        n = self.u("H")
        return bytes(self.take(n)).rstrip(b"\0").decode("utf-8", "replace")


def read_ct2(path: str | Path) -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, {variable name: array}) of a CTranslate2 ``model.bin``; aliases point at the
    same array. bfloat16 variables are widened to float32. Raises :class:`ModelError` for a file
    that is not one (the arrays are copies: the file is not kept open)."""
    path = Path(path)
    data = memoryview(path.read_bytes())
    r = _Reader(path, data)
    version = r.u("I")
    if not 1 <= version <= 10:
        raise ModelError(f"{path}: not a CTranslate2 model file (version field {version})")
    spec = r.name() if version >= 2 else ""
    if version >= 5:
        r.u("I")   # revision
    out: dict[str, np.ndarray] = {}
    for _ in range(r.u("I")):
        name = r.name()
        dims = [r.u("I") for _ in range(r.u("B"))]
        code = r.u("B") if version >= 4 else 0
        nbytes = r.u("I")
        raw = r.take(nbytes)
        if code == 5:   # bfloat16: the high half of a float32
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif code in _DTYPES:
            arr = np.frombuffer(raw, _DTYPES[code]).copy()
        else:
            raise ModelError(f"{path}: variable {name} has an unknown dtype code {code}")
        if arr.size != int(np.prod(dims, dtype=np.int64)):
            raise ModelError(f"{path}: variable {name} holds {arr.size} values for dims {dims}")
        out[name] = arr.reshape(dims)
    if version >= 3:
        for _ in range(r.u("I")):
            alias, target = r.name(), r.name()
            if target in out:
                out[alias] = out[target]
    return spec, out
