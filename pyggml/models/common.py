"""What the models share: :class:`ModelError`, GPT-2's byte-level alphabet, and the command
lines' device options (``--backend``, ``--devices``, ``--rpc``)."""
from __future__ import annotations

import argparse
import functools
from typing import Sequence

from pyggml import rpc
from pyggml.errors import BackendNotAvailableError

__all__ = ["ModelError", "bytes_to_unicode", "layer_owners", "add_device_options", "devices_of", "connect_rpc",
           "LOAD_ERRORS", "message"]


class ModelError(ValueError):
    """A model file or folder that a model cannot run (the message names it and says why)."""


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def layer_owners(n_layer: int, weights: Sequence[float]) -> list[int]:
    """The device index of each layer: contiguous runs of layers, device ``j`` getting about
    ``n_layer * weights[j] / sum(weights)`` of them (llama.cpp's layer split)."""
    total, acc, bounds = sum(weights), 0.0, []
    for w in weights:
        acc += w
        bounds.append(round(n_layer * acc / total))
    return [next(j for j, b in enumerate(bounds) if il < b) for il in range(n_layer)]


#: what loading a model raises for a bad file, setting, device or missing package: a command
#: line says ``error: message`` and exits 1
LOAD_ERRORS = (ModelError, ValueError, OSError, ImportError, BackendNotAvailableError)


def message(e: BaseException) -> str:
    """``e``'s message (a KeyError's, as BackendNotAvailableError is, without the quotes
    ``str()`` adds)."""
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)


def add_device_options(p: argparse.ArgumentParser, *, what: str, devices: str | None = None) -> None:
    """``--backend``, ``--rpc`` and (given its help, ``devices``) ``--devices`` on ``p``;
    ``what``: what the backend's device holds (for ``--backend``'s help)."""
    p.add_argument("--backend", default="cpu",
                   help=f"cpu (default), or a device such as numpy, CUDA0, Vulkan0, TORCH0, RPC0 (see `python -m "
                        f"pyggml info`): it holds {what} and runs what it supports, the CPU the rest, under "
                        "a ggml scheduler")
    p.add_argument("--rpc", metavar="HOST:PORT", action="append", default=[],
                   help="add the devices of a pyggml/ggml RPC server (`python -m pyggml.rpc` there), "
                        "repeatable: they are RPC0, RPC1... in this order")
    if devices is not None:
        p.add_argument("--devices", metavar="DEV,DEV,...", help=devices)


def devices_of(p: argparse.ArgumentParser, a: argparse.Namespace) -> list[str]:
    """The device names ``--devices`` gives (``[]`` without it); ``p.error`` when ``--backend``
    is given too."""
    names = [d.strip() for d in a.devices.split(",") if d.strip()] if getattr(a, "devices", None) else []
    if names and a.backend != "cpu":
        p.error("give --devices or --backend, not both")
    return names


def connect_rpc(endpoints: Sequence[str]) -> None:
    """Add the devices of the RPC servers at ``endpoints`` (``HOST:PORT``). Raises ValueError or
    ConnectionError as :func:`pyggml.rpc.add_server` does."""
    for endpoint in endpoints:
        rpc.add_server(endpoint)
