"""pyggml.backends.device and pyggml.backends.registry: devices, registries, backend properties."""
from __future__ import annotations

import pytest

import pyggml
from pyggml import BufferType, CPUBackend, Device, Registry
from pyggml.backends.device import device_by_name, device_by_type, devices
from pyggml.enums import BufferUsage, DeviceType
from pyggml.backends.registry import registries, registry_by_name


def test_registry_devices_and_backend_properties():
    assert "CPU" in [r.name for r in registries()]
    cpu_dev = device_by_name("cpu")  # case-insensitive, as ggml
    assert cpu_dev in devices() and cpu_dev.type == DeviceType.CPU
    assert Registry.of(cpu_dev) == registry_by_name("CPU")
    props = cpu_dev.props
    assert props.name == "CPU" and props.memory_total > 0
    with pytest.raises(KeyError):
        device_by_name("no-such-device")
    with device_by_type("cpu").init() as be:
        assert isinstance(be, CPUBackend) and be.name == "CPU" and len(be.guid) == 16
        buft = be.default_buffer_type
        assert buft.is_host and buft.alignment >= 32
        with pytest.raises(ValueError, match="no device"):  # ggml leaves the CPU buffer type without a device (ggml-backend.cpp)
            Device.of(buft)
        assert Device.of(be).name == "CPU"
        with buft.alloc_buffer(1024) as buf:
            assert BufferType.of(buf) == buft
            assert buf.size == 1024 and buf.is_host and buf.usage == BufferUsage.ANY
            buf.usage = "weights"
            assert buf.usage == BufferUsage.WEIGHTS
        with pytest.raises(ValueError):
            be.alloc_buffer(-1)
        assert Registry.of(Device.of(be)).get_proc_address("ggml_backend_set_n_threads") is not None
        with pytest.raises(ValueError, match="events"):
            pyggml.Event(Device.of(be))


def test_going_up_a_layer_takes_only_its_own_kind():
    """Registry.of, BufferType.of, Device.of and Context.of say what they take (TypeError), not
    a cffi error about a pointer."""
    from pyggml import Context
    for fn, arg in ((Registry.of, "CPU"), (BufferType.of, 1), (Device.of, None), (Context.of, 0)):
        with pytest.raises(TypeError, match="takes a"):
            fn(arg)
