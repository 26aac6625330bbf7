"""Voice activity detection: Silero VAD v6 (the model faster-whisper ships,
``faster_whisper/assets/silero_vad_v6.onnx``) as ggml graphs, and faster-whisper's rules that
turn its speech probabilities into speech chunks (:func:`speech_timestamps`), the audio of those
chunks (:func:`collect_chunks`) and times in it back to times in the original audio
(:class:`TimeMap`).

The model, for each chunk of 512 samples (16 kHz) with the 64 samples before it: a short-time
Fourier transform as a product with its 258 x 256 basis (frames of 256, hop 128, the chunk
reflected 128 samples at both ends; the first frame dropped), the magnitudes of 129
frequencies, four 1-D convolutions with ReLU (129 -> 128 -> 64 -> 64 -> 128 channels, strides
1, 2, 2, 1) down to one 128-vector, then an LSTM (hidden size 128) from chunk to chunk, ReLU and
a 1 x 128 product with a sigmoid: one speech probability per chunk. A graph takes
:data:`BLOCK` chunks (the last one fewer, rounded up to 16) and carries the LSTM's state to the
next; the LSTM's steps are nodes of the graph (each chunk's input product is one ``mul_mat``
for the whole block). The transform is two ``mul_mat`` over the chunks' rows of 128 samples,
each convolution over a chunk's 4, 2 or 1 frames one ``mul_mat`` with a matrix made from its
kernel at load (:func:`_as_products`): no ``im2col``, whose CPU kernel goes element by
element. The weights are read from the ONNX file with the ``onnx`` package once, then from the
cache.
"""
from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from pyggml import GGMLType, Tensor
from pyggml.runtime import GraphCache, GraphParts, default_threads, load_tensors, open_backend

from .convert import cache_dir

__all__ = ["VadOptions", "SileroVAD", "shared_vad", "silero_path", "read_silero", "read_onnx", "chunks_of", "speech_timestamps",
           "collect_chunks", "TimeMap", "CHUNK", "CONTEXT", "BLOCK"]

SAMPLE_RATE = 16000
#: samples per speech probability
CHUNK = 512
#: samples of the chunk before, in front of each chunk
CONTEXT = 64
#: chunks per graph (2 s): the graphs build fast; the LSTM's state goes from one to the next
BLOCK = 64
_HIDDEN = 128
_ROUND = 16          # a last block's chunks, rounded up to a multiple of this (fewer graphs)


@dataclass
class VadOptions:
    """faster-whisper's VAD parameters: ``threshold``: speech where the probability is at
    least this; ``neg_threshold``: silence where it is below this (default threshold - 0.15,
    at least 0.01); speech chunks shorter than ``min_speech_duration_ms`` are dropped, longer
    than ``max_speech_duration_s`` split (at the last silence of 98 ms or more, else there);
    ``min_silence_duration_ms`` of silence end a chunk; chunks are padded by ``speech_pad_ms``
    on each side."""

    threshold: float = 0.5
    neg_threshold: float | None = None
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400


def silero_path() -> Path:
    """``silero_vad_v6.onnx`` of the installed faster-whisper package (found, not imported).
    Raises FileNotFoundError with the pip command when it is not installed."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is not None and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            p = Path(d) / "assets" / "silero_vad_v6.onnx"
            if p.is_file():
                return p
    raise FileNotFoundError("the Silero VAD model is faster-whisper's: pip install --no-deps faster-whisper==1.2.1 "
                            "(its wheel carries faster_whisper/assets/silero_vad_v6.onnx), or give its path")


def read_silero(path: str | Path) -> dict[str, np.ndarray]:
    """:func:`read_onnx`, kept in the cache (:func:`~.convert.cache_dir`) by the file's
    SHA-256 (importing ``onnx`` alone takes most of a second)."""
    data = Path(path).read_bytes()
    cached = cache_dir() / f"silero-{hashlib.sha256(data).hexdigest()[:16]}.npz"
    if cached.is_file():   # arr_0: the names, then the arrays in their order
        with np.load(cached) as z:
            return {str(name): z[f"arr_{i + 1}"] for i, name in enumerate(z["arr_0"])}
    weights = read_onnx(path)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.npz")
    np.savez(tmp, np.array(list(weights)), *weights.values())
    os.replace(tmp, cached)
    return weights


def read_onnx(path: str | Path) -> dict[str, np.ndarray]:
    """The weights of Silero VAD v6's ONNX file, float32, named for the graph: ``stft``
    (258, 256), ``conv{i}.weight`` (out, in, 3) and ``conv{i}.bias``, ``lstm.W`` and ``lstm.R``
    (512, 128; gates i, o, f, c as ONNX orders them), ``lstm.b`` (512, both biases summed),
    ``decoder.weight`` (128,), ``decoder.bias`` (1,). Needs ``onnx`` (ImportError with the pip
    command); ValueError for a file that is not this model."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as e:
        raise ImportError('reading the Silero VAD model needs onnx: pip install "pyggml[whisper]"') from e
    m = onnx.load(str(path))
    init = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in m.graph.initializer}
    lstm = [n for n in m.graph.node if n.op_type == "LSTM"]
    try:
        (node,) = lstm
        W, R, B = (init[name] for name in node.input[1:4])
        out = {"stft": init["encoder.feature_extractor.forward_basis_buffer"].reshape(258, 256),
               "lstm.W": W.reshape(4 * _HIDDEN, _HIDDEN), "lstm.R": R.reshape(4 * _HIDDEN, _HIDDEN),
               "lstm.b": B.reshape(2, 4 * _HIDDEN).sum(axis=0),
               "decoder.weight": init["decoder.conv1d.weight"].reshape(_HIDDEN),
               "decoder.bias": init["decoder.conv1d.bias"].reshape(1)}
        for i in range(4):
            out[f"conv{i}.weight"] = init[f"encoder.conv_layers.{i}.weight"]
            out[f"conv{i}.bias"] = init[f"encoder.conv_layers.{i}.bias"]
    except (KeyError, ValueError) as e:
        raise ValueError(f"{path}: not Silero VAD v6 ({e!r})") from None
    return out


def chunks_of(samples: np.ndarray) -> np.ndarray:
    """The model's input: ``samples`` padded with zeros to a multiple of :data:`CHUNK`, each
    chunk after the :data:`CONTEXT` samples before it (zeros before the first), float32 NumPy
    shape (n_chunks, 576)."""
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    x = np.pad(x, (0, -x.size % CHUNK)) if x.size else np.zeros(CHUNK, np.float32)
    rows = x.reshape(-1, CHUNK)
    ctx = np.zeros((rows.shape[0], CONTEXT), np.float32)
    ctx[1:] = rows[:-1, -CONTEXT:]
    return np.concatenate([ctx, rows], axis=1)


_HOP = 128            # the transform's hop: a frame of 256 samples is two rows of 128
#: (frames in, stride) of each convolution (kernel 3, padding 1): 4 -> 4 -> 2 -> 1 -> 1 frames
_CONVS = ((4, 1), (4, 2), (2, 2), (1, 1))


def _as_products(w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights as the graph multiplies them: the transform's basis (258 x 256) padded with
    zero rows to 260 (ggml's tiled float32 kernel takes a multiple of 4 rows; others go dot
    product by dot product, 3x the time) and cut into the halves that multiply a frame's two
    rows of 128 samples; each convolution (kernel 3, padding 1, stride s) over the T frames of
    a chunk as one matrix from its (T, C) inputs to its (T_out, C_out) outputs (NumPy shape
    (T_out * C_out, T * C); the taps past the frames, zeros, left out), its bias repeated per
    output frame."""
    out = {k: v for k, v in w.items() if not k.startswith(("stft", "conv"))}
    basis = np.pad(w["stft"], ((0, 2), (0, 0)))
    out["stft.lo"], out["stft.hi"] = np.ascontiguousarray(basis[:, :_HOP]), np.ascontiguousarray(basis[:, _HOP:])
    for i, (t_in, stride) in enumerate(_CONVS):
        k, b = w[f"conv{i}.weight"], w[f"conv{i}.bias"]            # (C_out, C, 3), (C_out,)
        c_out, c_in, taps = k.shape
        t_out = (t_in - 1) // stride + 1
        m = np.zeros((t_out, c_out, t_in, c_in), np.float32)
        for t in range(t_out):
            for j in range(taps):
                src = stride * t + j - 1
                if 0 <= src < t_in:
                    m[t, :, src, :] = k[:, :, j]
        out[f"conv{i}.matrix"] = m.reshape(t_out * c_out, t_in * c_in)
        out[f"conv{i}.bias"] = np.tile(b, t_out)
    return out


class SileroVAD:
    """Silero VAD v6 on the CPU backend. ``path``: the ONNX file (default :func:`silero_path`).
    ``n_threads``: default :func:`~pyggml.runtime.default_threads`, at most 4 (the LSTM's
    nodes are small and many: on 2 cores, 220 s of audio took 0.22 s on both against 0.29 s
    on one). Raises FileNotFoundError, ImportError without ``onnx``, ValueError for another
    model or ``n_threads < 1``."""

    def __init__(self, path: str | Path | None = None, *, n_threads: int | None = None):
        weights = _as_products(read_silero(path if path is not None else silero_path()))
        self._stack = contextlib.ExitStack()
        try:
            threads = min(4, default_threads()) if n_threads is None else n_threads
            backend = self._stack.enter_context(open_backend("cpu", threads))
            self.w: dict[str, Tensor] = dict(self._stack.enter_context(load_tensors(weights, backend)))
            n = 16 * BLOCK + 128
            self.graphs = self._stack.enter_context(GraphCache(self._build, backend=backend, graph_size=n,
                                                               n_tensors=n, max_graphs=4))
        except BaseException:
            self._stack.close()
            raise

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> "SileroVAD":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self, g: GraphParts, n: int) -> dict[str, Tensor]:
        ctx, w = g.ctx, self.w
        f32 = GGMLType.F32
        x = g.input(f32, [CONTEXT + CHUNK, n], "chunks")
        h = g.input(f32, [_HIDDEN], "h")
        c = g.input(f32, [_HIDDEN], "c")
        H = g.input(f32, [_HIDDEN, n], "steps")   # the LSTM's outputs, copied in step by step (before the decoder reads it)
        # frames 1..4 of the transform (frame 0 is not used) read the chunk and 64 samples
        # reflected past its end: 640 samples, 5 rows of 128. Frame k is rows k and k + 1, so its
        # product with the basis is the basis's first half times row k plus its second half times
        # row k + 1: two products over all the rows, then the sum of two strided views of them
        p = ctx.reshape(ctx.pad_reflect_1d(x, 0, 64), _HOP, 5 * n)              # [128, 5n]
        lo, hi = ctx.mul_mat(w["stft.lo"], p), ctx.mul_mat(w["stft.hi"], p)       # [260, 5n] each
        row = lo.nb[1]
        spec = (ctx.view(lo, [260, 4, n], nb=[row, 5 * row])
                + ctx.view(hi, [260, 4, n], nb=[row, 5 * row], offset=row))     # [260, 4, n]
        re = ctx.view(spec, [129, 4, n], nb=[spec.nb[1], spec.nb[2]])          # rows 0..128: real parts
        im = ctx.view(spec, [129, 4, n], nb=[spec.nb[1], spec.nb[2]], offset=129 * spec.nb[0])
        y = ctx.reshape(ctx.sqrt(ctx.sqr(re) + ctx.sqr(im)), 129 * 4, n)        # [129 x 4 frames, n]
        # each convolution over a chunk's few frames: one product with its matrix (_as_products)
        for i in range(4):
            y = ctx.relu(ctx.mul_mat(w[f"conv{i}.matrix"], y) + w[f"conv{i}.bias"])   # ... [128, n]
        wx = ctx.mul_mat(w["lstm.W"], y) + w["lstm.b"]      # [512, n]
        D = _HIDDEN * wx.nb[0]
        for t in range(n):
            gates = ctx.view(wx, [4 * _HIDDEN], offset=t * wx.nb[1]) + ctx.mul_mat(w["lstm.R"], h)
            s = ctx.sigmoid(ctx.view(gates, [3 * _HIDDEN]))          # i, o, f
            cand = ctx.tanh(ctx.view(gates, [_HIDDEN], offset=3 * D))
            c = ctx.view(s, [_HIDDEN], offset=2 * D) * c + ctx.view(s, [_HIDDEN]) * cand
            h = ctx.view(s, [_HIDDEN], offset=D) * ctx.tanh(c)
            g.graph.build_forward(ctx.cpy(h, ctx.view(H, [_HIDDEN], offset=t * D)))   # step t's output, in order
        g.output(h, "hn")
        g.output(c, "cn")
        logit = ctx.mul_mat(ctx.reshape(w["decoder.weight"], _HIDDEN, 1), ctx.relu(H)) + w["decoder.bias"]   # [1, n]
        g.output(ctx.sigmoid(logit), "probs")
        return {}

    def probs(self, samples: np.ndarray | None = None, *, chunks: np.ndarray | None = None) -> np.ndarray:
        """The speech probability of each :data:`CHUNK` samples of ``samples`` (float32, 16 kHz;
        the last chunk padded with zeros), float32 NumPy shape (n_chunks,); or of the model
        inputs ``chunks`` (NumPy shape (n, 576), as :func:`chunks_of` makes them)."""
        if chunks is None:
            if samples is None:
                raise ValueError("give samples or chunks")
            chunks = chunks_of(samples)
        chunks = np.asarray(chunks, dtype=np.float32)
        if chunks.ndim != 2 or chunks.shape[1] != CONTEXT + CHUNK:
            raise ValueError(f"chunks must have NumPy shape (n, {CONTEXT + CHUNK}), not {chunks.shape}")
        out = np.empty(chunks.shape[0], np.float32)
        h = np.zeros(_HIDDEN, np.float32)
        c = np.zeros(_HIDDEN, np.float32)
        for start in range(0, chunks.shape[0], BLOCK):
            part = chunks[start:start + BLOCK]
            m = part.shape[0]
            n = BLOCK if m == BLOCK else -(-m // _ROUND) * _ROUND
            a = self.graphs.get(n).arrays
            a["chunks"][:m] = part
            a["chunks"][m:] = 0.0
            a["h"][:], a["c"][:] = h, c
            res = self.graphs.compute(n, ["probs", "hn", "cn"] if m == n else ["probs"])
            out[start:start + m] = res["probs"].reshape(-1)[:m]
            if m == n:
                h, c = res["hn"].reshape(-1), res["cn"].reshape(-1)
        return out


@functools.lru_cache(maxsize=1)
def shared_vad() -> SileroVAD:
    """The process's :class:`SileroVAD` of :func:`silero_path`, made on first use (as
    faster-whisper keeps one): the Whisper models' ``vad_filter`` use it."""
    return SileroVAD()


def speech_timestamps(probs: np.ndarray, n_samples: int, opts: VadOptions | None = None) -> list[dict[str, int]]:
    """faster-whisper's ``get_speech_timestamps`` from the chunks' speech probabilities
    ``probs`` of audio of ``n_samples`` samples: ``[{"start": sample, "end": sample}, ...]``."""
    o = opts or VadOptions()
    sr, win = SAMPLE_RATE, CHUNK
    thr = o.threshold
    neg = o.neg_threshold if o.neg_threshold is not None else max(thr - 0.15, 0.01)
    min_speech = sr * o.min_speech_duration_ms / 1000
    pad = sr * o.speech_pad_ms / 1000
    max_speech = sr * o.max_speech_duration_s - win - 2 * pad
    min_silence = sr * o.min_silence_duration_ms / 1000
    min_silence_at_max = sr * 98 / 1000
    triggered = False
    speeches: list[dict[str, int]] = []
    cur: dict[str, int] = {}
    temp_end = prev_end = next_start = 0
    for i, p in enumerate(np.asarray(probs, dtype=np.float64)):
        at = win * i
        if p >= thr and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = at
        if p >= thr and not triggered:
            triggered = True
            cur["start"] = at
            continue
        if triggered and at - cur["start"] > max_speech:
            if prev_end:
                cur["end"] = prev_end
                speeches.append(cur)
                cur = {}
                if next_start < prev_end:      # silence since, and no speech yet
                    triggered = False
                else:
                    cur["start"] = next_start
                prev_end = next_start = temp_end = 0
            else:
                cur["end"] = at
                speeches.append(cur)
                cur = {}
                prev_end = next_start = temp_end = 0
                triggered = False
                continue
        if p < neg and triggered:
            if not temp_end:
                temp_end = at
            if at - temp_end > min_silence_at_max:
                prev_end = temp_end
            if at - temp_end < min_silence:
                continue
            cur["end"] = temp_end
            if cur["end"] - cur["start"] > min_speech:
                speeches.append(cur)
            cur = {}
            prev_end = next_start = temp_end = 0
            triggered = False
    if cur and n_samples - cur["start"] > min_speech:
        cur["end"] = n_samples
        speeches.append(cur)
    for i, s in enumerate(speeches):
        if i == 0:
            s["start"] = int(max(0, s["start"] - pad))
        if i != len(speeches) - 1:
            gap = speeches[i + 1]["start"] - s["end"]
            if gap < 2 * pad:
                s["end"] += int(gap // 2)
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - gap // 2))
            else:
                s["end"] = int(min(n_samples, s["end"] + pad))
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - pad))
        else:
            s["end"] = int(min(n_samples, s["end"] + pad))
    return speeches


def collect_chunks(samples: np.ndarray, chunks: Sequence[dict[str, int]]) -> np.ndarray:
    """The samples of the speech ``chunks``, one after the other (an empty array for none)."""
    if not chunks:
        return np.zeros(0, np.float32)
    return np.concatenate([samples[c["start"]:c["end"]] for c in chunks]).astype(np.float32, copy=False)


def group_chunks(samples: np.ndarray, chunks: Sequence[dict[str, int]],
                 max_duration: float) -> list[tuple[np.ndarray, float, float]]:
    """faster-whisper's ``collect_chunks(..., max_duration)``: the speech ``chunks`` of
    ``samples`` joined in order into groups of at most ``max_duration`` seconds, each (its
    samples, its offset and its duration in seconds, both in the time of the chunks joined:
    :class:`TimeMap` maps them back)."""
    out: list[tuple[np.ndarray, float, float]] = []
    parts: list[np.ndarray] = []
    current = total = 0
    for c in chunks:
        n = c["end"] - c["start"]
        if parts and current + n > max_duration * SAMPLE_RATE:
            out.append((np.concatenate(parts), total / SAMPLE_RATE, current / SAMPLE_RATE))
            total += current
            parts, current = [], 0
        parts.append(samples[c["start"]:c["end"]])
        current += n
    if parts:
        out.append((np.concatenate(parts), total / SAMPLE_RATE, current / SAMPLE_RATE))
    return out


class TimeMap:
    """Times in the audio of :func:`collect_chunks` back to times in the original audio
    (faster-whisper's ``SpeechTimestampsMap``): each chunk's silence before it added back."""

    def __init__(self, chunks: Sequence[dict[str, int]], sampling_rate: int = SAMPLE_RATE, precision: int = 2):
        self.sr, self.precision = sampling_rate, precision
        self.chunk_end: list[int] = []
        self.silence_before: list[float] = []
        prev_end = silent = 0
        for c in chunks:
            silent += c["start"] - prev_end
            prev_end = c["end"]
            self.chunk_end.append(c["end"] - silent)
            self.silence_before.append(silent / sampling_rate)

    def chunk_index(self, time: float, is_end: bool = False) -> int:
        sample = int(time * self.sr)
        if is_end and sample in self.chunk_end:
            return self.chunk_end.index(sample)
        return min(bisect.bisect(self.chunk_end, sample), len(self.chunk_end) - 1)

    def original(self, time: float, chunk: int | None = None, is_end: bool = False) -> float:
        """``time`` (seconds of the collected audio) in the original audio."""
        i = self.chunk_index(time, is_end) if chunk is None else chunk
        return round(self.silence_before[i] + time, self.precision)

