"""The NumPy reference backend under its older name: :mod:`pyggml.impl.numpy`."""
from .impl.numpy import NAME, NumpyBackend, NumpyDevice, init, make_registry, register

__all__ = ["NAME", "NumpyBackend", "NumpyDevice", "make_registry", "register", "init"]
