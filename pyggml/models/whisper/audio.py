"""Audio in, log-mel out, as openai-whisper computes it (pure NumPy functions).

:func:`load_audio` reads any file ``soundfile`` reads (WAV, FLAC, OGG, MP3), mixes it to mono and
resamples it to 16 kHz with ``soxr``. :func:`log_mel` is openai-whisper's ``log_mel_spectrogram``:
a periodic Hann window of 400 samples, hop 160, ``torch.stft(center=True)``'s reflect padding of
200 samples, the power spectrum without its last frame, the model file's mel filters, ``log10``
clamped at 1e-10, floored 8 below the maximum, then ``(x + 4) / 4``.

The mel filters' product runs on one BLAS thread (``threadpoolctl``, when installed): a
multi-threaded OpenBLAS product leaves its worker threads spinning for about 0.1 s after it,
and on a machine with few cores they take a core from the ggml compute that follows (on 2
cores the encoder of a 30-s window took 0.45 s instead of 0.35 s).

The windowed frames and their spectrum (about 10 MB for a 30-s window; a longer recording's
are new arrays) go into buffers each thread keeps between calls, and the later steps are
computed in place: megabytes of new
temporaries at every call cost page faults whenever the C library has given the memory back
to the system (on 2 cores of a virtual machine: 8 ms a call for jfk.wav instead of 4 ms).
"""
from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np

__all__ = ["SAMPLE_RATE", "N_FFT", "HOP", "CHUNK", "FRAMES", "AudioError", "load_audio", "log_mel"]

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
CHUNK = 30 * SAMPLE_RATE          # samples in one 30-s window
FRAMES = CHUNK // HOP             # mel frames in one window: 3000


class AudioError(ValueError):
    """A file that is not audio ``soundfile`` can read (the message names the file)."""


def load_audio(path: str | os.PathLike[str] | BinaryIO) -> np.ndarray:
    """Float32 mono samples at 16 kHz, in [-1, 1], of an audio file (a path, or a binary file
    object). Raises FileNotFoundError for a missing file and :class:`AudioError` for one that
    is not readable audio."""
    import soundfile
    import soxr

    src: Any
    if hasattr(path, "read"):
        src = path
    else:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such audio file")
        src = str(path)
    try:
        data, rate = soundfile.read(src, dtype="float32", always_2d=True)
    except Exception as e:  # noqa: BLE001 - libsndfile's errors are RuntimeError/LibsndfileError/TypeError
        raise AudioError(f"{src}: not an audio file soundfile can read ({e})") from None
    mono = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
    if rate != SAMPLE_RATE and mono.size:
        mono = soxr.resample(mono, rate, SAMPLE_RATE).astype(np.float32)
    return np.ascontiguousarray(mono, dtype=np.float32)


def _hann(n: int) -> np.ndarray:
    """``torch.hann_window(n)`` (periodic), float32."""
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)).astype(np.float32)


_WINDOW = _hann(N_FFT)
_BLAS: list[Any] = []          # the process's threadpoolctl controller (or None), made on first use
_BLAS_LOCK = threading.Lock()   # one limit at a time: each restores the count it found


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """A context in which NumPy's BLAS uses one thread (``threadpoolctl``; no change without
    it). Threads take turns in it: two overlapping limits could restore each other's count."""
    with _BLAS_LOCK:
        if not _BLAS:
            try:
                from threadpoolctl import ThreadpoolController
                _BLAS.append(ThreadpoolController())
            except ImportError:
                _BLAS.append(None)
        if _BLAS[0] is None:
            yield
            return
        with _BLAS[0].limit(limits=1, user_api="blas"):
            yield


#: the largest buffer a thread keeps for :func:`log_mel` (bytes): a 30-s window's frames or
#: spectrum (4.8 MB each) are kept, the whole of a long recording's are not
_SCRATCH_MAX = 5 << 20


class _Scratch(threading.local):
    """:func:`log_mel`'s buffers of this thread (grown as needed, kept between calls up to
    :data:`_SCRATCH_MAX` bytes each; larger ones are new arrays)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        n = int(np.prod(shape))
        if n * np.dtype(dtype).itemsize > _SCRATCH_MAX:
            return np.empty(shape, dtype)
        a = self.arrays.get(name)
        if a is None or a.size < n or a.dtype != dtype:
            a = self.arrays[name] = np.empty(n, dtype)
        return a[:n].reshape(shape)


_SCRATCH = _Scratch()
_RFFT_OUT = np.lib.NumpyVersion(np.__version__) >= "2.0.0"   # rfft(out=), float32 kept (NumPy 2)
#: frames per call of NumPy's FFT: its temporaries stay small enough for the C library's heap to
#: keep (1,100 frames at once took 4 ms on 2 cores whenever their memory had been given back,
#: 1.2 ms in pieces of 256)
_FFT_ROWS = 256


def _rfft(frames: np.ndarray) -> np.ndarray:
    """NumPy's real FFT of each row of ``frames`` (float32, NumPy shape (m, 400)), into a kept
    buffer (NumPy 2; a new array before): complex, (m, 201), in pieces of :data:`_FFT_ROWS`
    rows (each row's transform is the same whatever the piece)."""
    m = frames.shape[0]
    if _RFFT_OUT:
        spec = _SCRATCH.get("spec", (m, N_FFT // 2 + 1), np.complex64)
        for s in range(0, m, _FFT_ROWS):
            np.fft.rfft(frames[s:s + _FFT_ROWS], axis=-1, out=spec[s:s + _FFT_ROWS])
        return spec
    spec = np.empty((m, N_FFT // 2 + 1), np.complex128)
    for s in range(0, m, _FFT_ROWS):
        spec[s:s + _FFT_ROWS] = np.fft.rfft(frames[s:s + _FFT_ROWS], axis=-1)
    return spec


def log_mel(samples: np.ndarray, filters: np.ndarray, n_frames: int | None = None, pad: int = 0) -> np.ndarray:
    """The log-mel spectrogram of ``samples`` (float32 at 16 kHz, any length) followed by ``pad``
    zeros: float32, NumPy shape (n_mels, frames) with frames = (len(samples) + pad) // 160 (or
    ``n_frames``: the samples are zero-padded or cut to ``n_frames * 160`` first); a new array.
    ``filters``: the model file's mel filters, (n_mels, 201). The frames that see only the
    padding's zeros are not transformed, and the frames after the last of any power not
    multiplied by the filters: their power and mel are 0 (the result is that of the padded
    samples, bit for bit)."""
    x = np.asarray(samples, dtype=np.float32)
    if n_frames is not None:
        n = n_frames * HOP
        x = np.pad(x[:n], (0, max(0, n - x.size)))
    total = (x.size + pad) // HOP                    # frames of the padded samples
    if x.size == 0 or total == 0:
        return np.zeros((filters.shape[0], total), np.float32)
    half = N_FFT // 2
    # frames 0..m-1 see a sample of x (frame k covers samples [k*HOP - 200, k*HOP + 200))
    m = min(total, (x.size + half - 1) // HOP + 1)
    x = np.pad(x, (0, min(pad, m * HOP + half - x.size)))     # the zeros those frames see
    padded = np.pad(x, (half, half), mode="reflect") if x.size > half else np.pad(x, (half, half))
    frames = np.lib.stride_tricks.as_strided(padded, (m, N_FFT), (padded.strides[0] * HOP, padded.strides[0]))
    windowed = _SCRATCH.get("frames", (m, N_FFT), np.float32)
    np.multiply(frames, _WINDOW, out=windowed)
    spec = _rfft(windowed)
    re, im = spec.real, spec.imag                    # (power: re**2 + im**2, in the spectrum's type)
    np.square(re, out=re)
    np.square(im, out=im)
    power = windowed.reshape(-1)[:m * (N_FFT // 2 + 1)].reshape(m, N_FFT // 2 + 1)   # the frames are done
    np.add(re, im, out=power, casting="same_kind")
    # the frames up to the last of any power: the rest are 0 in the product too (the same
    # product, of the same shape, whether the zeros were given as samples or as ``pad``)
    rows = np.flatnonzero(power.any(axis=1))
    n = int(rows[-1]) + 1 if rows.size else 0
    out = np.empty((filters.shape[0], total), np.float32)     # (n_mels, frames): log10 of the mel,
    if n:                                                      # of 1e-10 (0 clamped) after the product
        prod = _SCRATCH.get("mel", (filters.shape[0], n), np.float32)
        with _one_blas_thread():
            np.matmul(filters.astype(np.float32), power[:n].T, out=prod)
        np.maximum(prod, 1e-10, out=prod)
        np.log10(prod, out=prod)
        out[:, :n] = prod
    out[:, n:] = np.log10(np.maximum(np.zeros(1, np.float32), 1e-10))
    np.maximum(out, out.max() - 8.0, out=out)
    np.add(out, 4.0, out=out)
    np.divide(out, 4.0, out=out)
    return out
