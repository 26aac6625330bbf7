"""pyggml.buffer: buffers over NumPy memory."""
from __future__ import annotations

import numpy as np
import pytest

import pyggml
from pyggml.device import device_by_type


def test_backend_buffer_from_numpy_without_copy():
    arr = pyggml.cpu.aligned_zeros(64, np.float32)
    buf = pyggml.cpu.cpu_buffer_from_array(arr)
    assert buf.base == arr.__array_interface__["data"][0] and buf.size == arr.nbytes
    buf.clear(0)
    buf.numpy()[:4] = 1
    assert arr.view(np.uint8)[:4].tolist() == [1, 1, 1, 1]
    dev_buf = device_by_type("cpu").buffer_from_host_ptr(arr)
    assert dev_buf.size == arr.nbytes
    with pytest.raises(ValueError, match="aligned"):
        pyggml.cpu.cpu_buffer_from_array(np.zeros(65, dtype=np.uint8)[1:])
