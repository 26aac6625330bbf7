"""The NumPy backend's kernel table under its older name: :mod:`pyggml.impl.numpy.table`."""
from .impl.numpy import OPS, OpImpl, compute, supported_op_names, supports

__all__ = ["supports", "compute", "OPS", "OpImpl", "supported_op_names"]
