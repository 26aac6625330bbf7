"""ggml's RPC backend: run graphs on devices of another process or machine (``ggml-rpc.h``).

**Security: the RPC protocol has no authentication and no encryption.** Anyone who can reach a
server's port can allocate memory on it and run any graph with it. Servers listen on loopback
(127.0.0.1) by default; :func:`start_server` and ``python -m pyggml.rpc`` refuse any other
address unless asked explicitly (``allow_remote=True`` / ``--allow-remote``), and then only
belong on a network you trust completely.

Server (blocks for ever; upstream ggml ships no ``rpc-server`` program, this is it)::

    python -m pyggml.rpc --port 50052            # serves this machine's devices on 127.0.0.1

Client::

    reg = pyggml.rpc.add_server("127.0.0.1:50052")   # a Registry with one device per remote device
    backend = reg.devices[0].init()                    # then use it like any other backend

Needs a build with the RPC backend (``PYGGML_BACKENDS=cpu,rpc``); otherwise these raise
:class:`~pyggml.errors.BackendNotAvailableError`.

**What cannot be made safe: a server that dies or misbehaves while a client uses it.** ggml's
RPC client aborts the process (``GGML_ABORT("Remote RPC server crashed or returned malformed
response")``, ggml-rpc.cpp's ``RPC_STATUS_ASSERT``) when a call on an established connection
fails: allocating, setting or getting a tensor, computing a graph on an RPC device; and
initialising a backend on an RPC device (``Device.init``) connects again and aborts ("Failed to
connect") if the server has gone since :func:`add_server`. pyggml cannot
check for this before the call (the server may go away at any moment) and cannot catch an abort:
this is the one place where pyggml's no-crash guarantee does not hold. Run the client where losing
the process is acceptable (a worker process), or keep the server's lifetime tied to the client's
(:class:`Server` as a context manager). Connecting (:func:`add_server`) is checked first: pyggml
makes ggml's HELLO handshake itself before ggml's client does, so an endpoint where nothing
accepts a TCP connection, something that is not a ggml RPC server, or a server of another
protocol version is a ConnectionError, not an abort (ggml's client aborts on each: "Failed to
connect", "RPC handshake failed").

**Client and server must speak the same protocol version** (``RPC_PROTO_MAJOR_VERSION``): ggml
0.26 speaks version 8, ggml 0.25 version 7, so a client of one cannot use a server of the other
(:func:`add_server` says which version the server speaks). Start servers with the same pyggml
(or a ggml of the same protocol version) as the clients.
"""
from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from .backends.device import Device, device_by_name, devices as all_devices
from .errors import BackendNotAvailableError
from .raw import GGML_VERSION, PACKAGE_DIR, dl, ffi, lib
from .raw.boundary import calling
from .backends.registry import Registry

__all__ = ["DEFAULT_PORT", "add_server", "server_version", "start_server", "Server", "main"]

DEFAULT_PORT = 50052  # upstream rpc-server's default

_added: dict[str, Registry] = {}


def _require_rpc() -> None:
    st = dl.status().get("rpc")
    if st is None or not st.loaded:
        raise BackendNotAvailableError(f"ggml's RPC backend is not available: {dl.explain('RPC')}")


def _endpoint(endpoint: str) -> str:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"RPC endpoint must be 'host:port', got {endpoint!r}")
    return endpoint


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: ggml-rpc.cpp: the HELLO command (always 14), its request (connection capabilities, 24 bytes:
#: none asked for here) and response (major, minor, patch, padding, capabilities)
_RPC_CMD_HELLO = 14
_HELLO_REQ_SIZE = 24
_HELLO_RSP_SIZE = 4 + 24


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def server_version(endpoint: str, timeout: float = 10.0) -> tuple[int, int, int]:
    """The RPC protocol version (major, minor, patch) of the server at ``endpoint``
    (``"host:port"``), asked with ggml's HELLO command on a connection of its own.

    Raises ValueError for a malformed endpoint, ConnectionError if nothing accepts a connection
    there, what answers is not a ggml RPC server (it closes the connection, or answers the HELLO
    with something of the wrong size) or does not answer within ``timeout`` seconds (a server
    serves one client at a time)."""
    _endpoint(endpoint)
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            sock.sendall(struct.pack("<BQ", _RPC_CMD_HELLO, _HELLO_REQ_SIZE) + bytes(_HELLO_REQ_SIZE))
            size = _recv_exactly(sock, 8)
            rsp = _recv_exactly(sock, _HELLO_RSP_SIZE) if len(size) == 8 else b""
    except socket.timeout:
        raise ConnectionError(f"the server at {endpoint} accepted a connection but did not answer "
                              f"ggml's HELLO handshake within {timeout:g} s: a ggml RPC server serves "
                              "one client at a time, and it may be serving another") from None
    except OSError as e:
        raise ConnectionError(f"no ggml RPC server answered at {endpoint} ({e})") from None
    if len(size) != 8 or struct.unpack("<Q", size)[0] != _HELLO_RSP_SIZE or len(rsp) != _HELLO_RSP_SIZE:
        raise ConnectionError(f"what answers at {endpoint} is not a ggml RPC server (its reply to "
                              "ggml's HELLO handshake is not one)")
    major, minor, patch = rsp[:3]
    return major, minor, patch


def add_server(endpoint: str) -> Registry:
    """Connect to the RPC server at ``endpoint`` (``"host:port"``) and register its devices
    (``ggml_backend_rpc_add_server`` + ``ggml_backend_register``): they appear in
    :func:`pyggml.devices` as ``RPC0``, ``RPC1``... with the endpoint as description. Adding the
    same endpoint again returns the same registry.

    Raises ValueError for a malformed endpoint, ConnectionError if nothing accepts a connection
    there, what answers is not a ggml RPC server, it speaks another protocol version than this
    build's ggml (:func:`server_version`) or offers no device, BackendNotAvailableError if this
    build has no RPC backend. Once connected,
    a server that dies aborts the process on the next call that reaches it (see the module
    docstring: ggml's RPC client asserts, which pyggml cannot prevent).
    """
    _require_rpc()
    _endpoint(endpoint)
    if endpoint in _added:
        return _added[endpoint]
    # ggml's client aborts when it cannot connect or the handshake fails: find out first
    major, minor, patch = server_version(endpoint)
    ours = int(getattr(lib, "RPC_PROTO_MAJOR_VERSION"))
    if major != ours or minor > int(getattr(lib, "RPC_PROTO_MINOR_VERSION")):
        raise ConnectionError(f"the RPC server at {endpoint} speaks protocol {major}.{minor}.{patch}; "
                              f"this build (ggml {GGML_VERSION}) speaks {ours}.x: client and server "
                              "must come from ggml versions of the same RPC protocol (ggml 0.25: 7, "
                              "0.26: 8)")
    with calling():
        # ggml-rpc.h's functions are in lib (and its stub) only in builds with the RPC backend
        reg = getattr(lib, "ggml_backend_rpc_add_server")(endpoint.encode())
        if reg == ffi.NULL:
            raise ConnectionError(f"no ggml RPC server answered at {endpoint} (or it has no devices)")
        lib.ggml_backend_register(reg)
    _added[endpoint] = Registry(reg)
    return _added[endpoint]


def start_server(endpoint: str = f"127.0.0.1:{DEFAULT_PORT}", devices: Sequence[Device] | None = None,
                 *, n_threads: int | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 allow_remote: bool = False) -> None:
    """Serve ``devices`` (default: every device of this process except RPC ones) to RPC clients
    at ``endpoint`` (``ggml_backend_rpc_start_server``). **Never returns**: it serves one client
    after another until the process ends, with the GIL released, so run it in a process of its
    own (``python -m pyggml.rpc``, or :class:`Server`).

    ``n_threads``: CPU threads for CPU devices (default: all cores). ``cache_dir``: where the
    server caches large tensors by hash (default: none). A host other than loopback needs
    ``allow_remote=True`` (the protocol has no authentication). Raises ValueError for a malformed
    endpoint, ``n_threads`` < 1, a non-loopback host without ``allow_remote``, or no device to serve;
    BackendNotAvailableError without an RPC backend.
    """
    _require_rpc()
    host = _endpoint(endpoint).rpartition(":")[0]
    if n_threads is not None and n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    if not _is_loopback(host) and not allow_remote:
        raise ValueError(
            f"refusing to serve on {host}: ggml's RPC protocol has no authentication, anyone who "
            f"reaches the port can run code on this machine's devices. Use 127.0.0.1, or pass "
            f"allow_remote=True on a network you trust completely")
    if devices is None:
        devices = [d for d in all_devices() if not d.name.startswith("RPC")]
    if not devices:
        raise ValueError("no device to serve")
    arr = ffi.new("ggml_backend_dev_t[]", [d.ptr for d in devices])
    getattr(lib, "ggml_backend_rpc_start_server")(
        endpoint.encode(), os.fsencode(cache_dir) if cache_dir else ffi.NULL,
        n_threads or os.cpu_count() or 1, len(devices), arr)
    # it returns only when it could not start (bad endpoint, port in use): ggml printed why
    raise OSError(f"the RPC server could not start on {endpoint} (see its output above)")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Server:
    """An RPC server in a child process (``python -m pyggml.rpc``), for tests and notebooks::

        with pyggml.rpc.Server() as server:          # a free port on 127.0.0.1
            reg = pyggml.rpc.add_server(server.endpoint)

    Leaving the block (or :meth:`close`) kills the child. ``port=None`` picks a free port;
    ``devices``: device names to serve (default: all but RPC). Raises TimeoutError if the server
    does not accept connections within ``timeout`` seconds (its output is in the message).
    """

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, *,
                 devices: Sequence[str] | None = None, n_threads: int | None = None,
                 timeout: float = 30.0, allow_remote: bool = False):
        self.host, self.port = host, port or _free_port(host)
        self.endpoint = f"{host}:{self.port}"
        cmd = [sys.executable, "-m", "pyggml.rpc", "--host", host, "--port", str(self.port)]
        for d in devices or []:
            cmd += ["--device", d]
        if n_threads:
            cmd += ["--threads", str(n_threads)]
        if allow_remote:
            cmd.append("--allow-remote")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_DIR.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
        # cwd: the folder holding this pyggml, so that `-m pyggml.rpc` cannot pick up another
        # (e.g. the unbuilt source tree when started from a checkout)
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                        cwd=PACKAGE_DIR.parent)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                out = self.process.stdout.read().decode(errors="replace") if self.process.stdout else ""
                raise OSError(f"the RPC server exited with code {self.process.returncode}:\n{out}")
            with contextlib.suppress(OSError), socket.create_connection((host, self.port), timeout=0.5):
                break  # it accepts; this probe connection is closed at once and the server moves on
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"the RPC server did not start listening on {self.endpoint} in {timeout} s")
            time.sleep(0.05)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pyggml.rpc.Server {self.endpoint} pid {self.process.pid}>"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pyggml.rpc",
        description="Serve this machine's ggml devices to ggml RPC clients (upstream's rpc-server). "
                    "WARNING: the protocol has no authentication; keep it on loopback or a network "
                    "you trust completely.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("-p", "--port", type=int, default=DEFAULT_PORT, help=f"default: {DEFAULT_PORT}")
    p.add_argument("-d", "--device", action="append", help="device to serve (repeatable; default: all)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("-c", "--cache", type=Path, default=None, help="directory for the tensor cache")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host (no authentication: trusted networks only)")
    a = p.parse_args(argv)
    try:
        devs = [device_by_name(n) for n in a.device] if a.device else None
        if not _is_loopback(a.host):
            print(f"WARNING: serving on {a.host}: ggml's RPC protocol has NO authentication and NO "
                  "encryption. Anyone who reaches this port can use this machine's devices. "
                  "Never expose it to an open network.", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the C loop never returns to Python
        start_server(f"{a.host}:{a.port}", devs, n_threads=a.threads, cache_dir=a.cache,
                     allow_remote=a.allow_remote)
    except (ValueError, KeyError, OSError) as e:
        print(f"pyggml.rpc: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
