"""whisper.cpp's model file (``ggml-*.bin``): read into hyperparameters, mel filters, vocabulary
and a tensor table (whose bytes :func:`pyggml.runtime.load_tensors` loads into backend
buffers); and written (by :mod:`.convert`).

Layout (little-endian, no padding): u32 magic ``0x67676d6c``; eleven i32 hyperparameters
(:class:`~pyggml.models.whisper.hparams.HParams`); the mel filters, i32 n_mel, i32 n_fft and n_mel x n_fft f32; the
vocabulary, i32 count and per token an u32 length and its bytes; then until the end, per tensor:
i32 n_dims, i32 name length, i32 ggml type, i32 ne[n_dims] (ggml order), the name and the data.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Mapping, Sequence

import numpy as np

from pyggml import GGMLType
from pyggml.core.gguf import TensorInfo
from pyggml.types import row_size

from ..common import ModelError
from .hparams import HParams, expected_tensors

__all__ = ["MAGIC", "WhisperFile", "write_model"]

#: the file's first four bytes, little-endian ("ggml")
MAGIC = 0x67676D6C


class WhisperFile:
    """A whisper.cpp model file, checked: ``hparams``, ``mel_filters`` (float32, NumPy shape
    (n_mels, n_fft // 2 + 1)), ``vocab`` (the bytes of each token stored, in id order: the BPE
    tokens, not the special ones) and ``tensors`` (GGUF's :class:`~pyggml.core.gguf.TensorInfo`,
    ``offset`` from the start of the file, in file order; also
    :meth:`tensor_info`). The data stays in the file (a memory map): a
    :class:`~pyggml.backends.weights.TensorSource`, which
    :func:`~pyggml.runtime.load_tensors` loads into backend buffers. ``weights=False`` accepts a file without
    tensors (whisper.cpp's test files). Raises :class:`~.hparams.ModelError` naming the file for
    a wrong magic, a truncated file, odd sizes, a missing, unexpected or mis-shaped tensor;
    FileNotFoundError for a missing file."""

    def __init__(self, path: str | Path, *, weights: bool = True):
        self.path = Path(path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r") if self.path.stat().st_size else np.zeros(0, np.uint8)
        buf = memoryview(self._map)  # type: ignore[arg-type]
        pos = 0

        def take(n: int) -> memoryview:
            nonlocal pos
            if n < 0 or pos + n > len(buf):
                raise ModelError(f"{self.path}: truncated whisper.cpp model file (at byte {pos})")
            pos += n
            return buf[pos - n:pos]

        def ints(n: int, fmt: str = "i") -> tuple[int, ...]:
            return struct.unpack(f"<{n}{fmt}", take(4 * n))

        (magic,) = ints(1, "I")
        if magic != MAGIC:
            raise ModelError(f"{self.path}: not a whisper.cpp model file (magic {magic:#x}, expected {MAGIC:#x})")
        self.hparams = hp = HParams(*ints(11))
        hp.check(str(self.path))
        n_mel, n_fft = ints(2)
        if n_mel != hp.n_mels or n_fft != 201:
            raise ModelError(f"{self.path}: mel filters of {n_mel} x {n_fft}, expected {hp.n_mels} x 201")
        self.mel_filters = np.frombuffer(take(4 * n_mel * n_fft), np.float32).reshape(n_mel, n_fft).copy()
        (n_tokens,) = ints(1)
        if not 0 < n_tokens <= hp.n_vocab:
            raise ModelError(f"{self.path}: {n_tokens} tokens stored for a vocabulary of {hp.n_vocab}")
        self.vocab: list[bytes] = []
        for _ in range(n_tokens):
            (n,) = ints(1, "I")
            self.vocab.append(bytes(take(n)))
        self._by_name: dict[str, TensorInfo] = {}
        expected = expected_tensors(hp)
        while pos < len(buf):
            n_dims, n_name, ttype = ints(3)
            if not 1 <= n_dims <= 4 or not 0 < n_name < 256:
                raise ModelError(f"{self.path}: a tensor header at byte {pos - 12} is corrupt")
            ne = ints(n_dims)
            name = bytes(take(n_name)).decode("utf-8", "replace")
            try:
                t = GGMLType(ttype)
                size = row_size(t, ne[0]) * int(np.prod(ne[1:], dtype=np.int64))
            except ValueError:
                raise ModelError(f"{self.path}: tensor {name} has type {ttype}, unknown or of a bad row length") from None
            if name not in expected:
                raise ModelError(f"{self.path}: unexpected tensor {name!r}")
            if tuple(ne) != expected[name]:
                raise ModelError(f"{self.path}: tensor {name} has ne {list(ne)}, expected {list(expected[name])}")
            self._by_name[name] = TensorInfo(name, t, tuple(ne), pos, size)
            take(size)
        #: every tensor's :class:`~pyggml.core.gguf.TensorInfo`, in file order
        self.tensors: tuple[TensorInfo, ...] = tuple(self._by_name.values())
        if weights:
            missing = [n for n in expected if n not in self._by_name]
            if missing:
                raise ModelError(f"{self.path}: {len(missing)} tensors missing, e.g. {missing[0]!r}")

    def tensor_info(self, name: str) -> TensorInfo:
        """The :class:`~pyggml.core.gguf.TensorInfo` of tensor ``name``; KeyError if there is none."""
        return self._by_name[name]

    def raw(self, name: str) -> np.ndarray:
        """The bytes of tensor ``name`` (uint8, a read-only view of the file). KeyError if none."""
        i = self._by_name[name]
        return np.asarray(self._map[i.offset:i.offset + i.size])


def write_model(path: str | Path, hp: HParams, mel_filters: np.ndarray, vocab: Sequence[bytes],
                tensors: Mapping[str, tuple[GGMLType, np.ndarray]]) -> None:
    """Write a whisper.cpp model file: ``tensors`` maps each name of
    :func:`~pyggml.models.whisper.hparams.expected_tensors` to (ggml type, its data as stored: uint8 bytes of a
    quantized type, else an array of that type, NumPy shape ne reversed)."""
    hp.check(str(path))
    expected = expected_tensors(hp)
    if set(tensors) != set(expected):
        raise ModelError(f"{path}: tensors {sorted(set(expected) ^ set(tensors))[:3]} missing or unexpected")
    with open(path, "wb") as f:
        w: BinaryIO = f
        w.write(struct.pack("<I11i", MAGIC, *(getattr(hp, k) for k in HParams.FIELDS)))
        filters = np.ascontiguousarray(mel_filters, dtype=np.float32)
        w.write(struct.pack("<2i", *filters.shape))
        w.write(filters.tobytes())
        w.write(struct.pack("<i", len(vocab)))
        for tok in vocab:
            w.write(struct.pack("<I", len(tok)) + tok)
        for name, ne in expected.items():
            t, data = tensors[name]
            raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
            if raw.nbytes != row_size(t, ne[0]) * int(np.prod(ne[1:], dtype=np.int64)):
                raise ModelError(f"{path}: tensor {name} has {raw.nbytes} bytes for type {t.name} and ne {list(ne)}")
            key = name.encode()
            w.write(struct.pack(f"<3i{len(ne)}i", len(ne), len(key), int(t), *ne) + key)
            w.write(raw.tobytes())
