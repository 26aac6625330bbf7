"""A GGUF file's weight matrices in another type (llama.cpp's ``llama-quantize`` in its simplest
form): every 2-D tensor but the token embeddings, requantized with ggml's own quantizer from the
values ggml dequantizes; the rest, and the metadata, as stored."""
from __future__ import annotations

import os
from pathlib import Path

from pyggml.core.gguf import GGUFFile, GGUFWriter
from pyggml.types import block_size, can_quantize, ggml_type, quantize

__all__ = ["requantize"]


def requantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], wtype: str) -> Path:
    """Write ``dst``: ``src`` with its matrices in ``wtype`` (``"q4_0"``, ``"q8_0"``, ``"f16"``...;
    a matrix whose rows are not a multiple of the type's block stays as stored). Returns ``dst``.
    Raises ValueError for a type ggml cannot quantize to, what :class:`GGUFFile` raises for
    ``src``."""
    t = ggml_type(wtype)
    if not can_quantize(t):
        raise ValueError(f"ggml cannot quantize to {t.name}")
    out = Path(dst)
    with GGUFFile(src) as f, GGUFWriter() as w:
        md = f.metadata
        for key in md:
            w.add_value(key, md[key], md.value_type(key), md.element_type(key))
        for info in f.tensors:
            if len(info.ne) == 2 and info.name != "token_embd.weight" and info.ne[0] % block_size(t) == 0:
                w.add_tensor(info.name, quantize(f.array(info.name), t), t, info.ne)
            else:
                w.add_tensor(info.name, f.raw(info.name), info.type, info.ne)
        w.write(out)
    return out
