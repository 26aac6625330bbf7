#!/usr/bin/env python3
"""SmolLM2 over several RPC servers, split by layers and by tensors, against the CPU alone.

    python benchmarks/bench_distributed.py [--servers 1 2 3] [--prompt 64] [--decode 32] [--threads 1]

Needs a build with the RPC backend (``PYGGML_BACKENDS=cpu,rpc``). Starts the servers as child
processes on 127.0.0.1 (``pyggml.rpc.Server``, each serving its CPU with ``--threads``), then
for the CPU alone (``--threads`` threads) and each (number of servers, split mode): prompt
tokens/s (one ``--prompt``-token batch) and decode tokens/s (``--decode`` steps after it),
median of ``--repeat`` runs after a warm-up; and, measured once through a counting TCP proxy in
front of each server, what one decoded token costs on the wire: bytes sent to the servers, bytes
received, and round trips (a request answered by the server; ggml's RPC client waits for each
answer). ggml's RPC backend exposes no traffic counters, hence the proxy.

**On one machine this measures the protocol's cost, not a speed-up**: the servers share the
cores with the client, and loopback has no network latency. What predicts a real cluster is the
traffic per token: with link bandwidth B and round-trip time R, decode costs at least
``bytes / B + round_trips * R`` per token on top of the devices' compute (for 1 Gbit/s and 0.2 ms:
8 ns per byte and 0.2 ms per round trip). Nothing here is asserted.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
import pyggml  # noqa: E402
from pyggml import rpc  # noqa: E402
from pyggml.models.llama import Llama, default_model_path  # noqa: E402


class CountingProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target`` (host:port) that counts the bytes each way
    and the round trips (a client -> server message followed by the server's answer)."""

    def __init__(self, target: str):
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.sent = self.received = self.round_trips = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> None:
        with self._lock:
            self.sent = self.received = self.round_trips = 0

    def _accept(self) -> None:
        while True:
            client, _ = self.sock.accept()
            server = socket.create_connection(self.target)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            state = {"last": None}
            threading.Thread(target=self._pump, args=(client, server, True, state), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False, state), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_server: bool, state: dict) -> None:
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                with self._lock:
                    if to_server:
                        self.sent += len(data)
                    else:
                        self.received += len(data)
                        if state["last"] is True:  # the first bytes of an answer
                            self.round_trips += 1
                    state["last"] = to_server
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def run(llm: Llama, prompt: list[int], n_decode: int) -> tuple[float, float]:
    """(prompt seconds, decode seconds) of one run from an empty cache."""
    m = llm.model
    m.reset()
    t0 = time.perf_counter()
    logits = m.eval(prompt)
    t1 = time.perf_counter()
    for _ in range(n_decode):
        logits = m.eval([int(np.argmax(logits))])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens (default 64)")
    p.add_argument("--decode", type=int, default=32, help="decode steps (default 32)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of each server and of the CPU alone")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    if "rpc" not in pyggml.dl.built_backends():
        sys.exit("this pyggml has no RPC backend: build it with PYGGML_BACKENDS=cpu,rpc")
    n_max = max(a.servers)
    servers = [rpc.Server(devices=["CPU"], n_threads=a.threads) for _ in range(n_max)]
    proxies = [CountingProxy(s.endpoint) for s in servers]
    try:
        direct = [rpc.add_server(s.endpoint).devices[0].name for s in servers]
        counted = [rpc.add_server(px.endpoint).devices[0].name for px in proxies]
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(100, 40000, a.prompt)]
        path = default_model_path()
        configs: list[tuple[str, dict, list[str]]] = [("CPU alone", {}, [])]
        for n in a.servers:
            for split in ("layer", "tensor"):
                if n == 1 and split == "tensor":
                    continue
                label = f"{n} server{'s' if n > 1 else ''}" + (f", {split} split" if n > 1 else "")
                configs.append((label, {"split": split}, list(range(n))))
        print(f"SmolLM2-135M Q4_1, prompt {a.prompt} tokens, {a.decode} decode steps, "
              f"{a.threads} thread(s) per server and for the CPU alone, median of {a.repeat}")
        print(f"{'':24s} {'prompt tok/s':>12s} {'decode tok/s':>12s} {'vs CPU':>7s} "
              f"{'sent B/tok':>11s} {'recv B/tok':>11s} {'round trips/tok':>15s}")
        base = None
        for label, kw, idx in configs:
            devices = [direct[i] for i in idx]
            with Llama(path, devices=devices or None, n_threads=a.threads, **kw) as llm:
                run(llm, prompt, 2)  # warm-up: graphs built and placed
                times = [run(llm, prompt, a.decode) for _ in range(a.repeat)]
            pp = a.prompt / statistics.median(t[0] for t in times)
            tg = a.decode / statistics.median(t[1] for t in times)
            base = base or tg
            wire = f"{'-':>11s} {'-':>11s} {'-':>15s}"
            if idx:
                with Llama(path, devices=[counted[i] for i in idx], n_threads=a.threads, **kw) as llm:
                    run(llm, prompt, 2)
                    llm.model.reset()
                    llm.model.eval(prompt)
                    for px in proxies:
                        px.reset()
                    logits = llm.model.eval([prompt[-1]])
                    for _ in range(a.decode - 1):
                        logits = llm.model.eval([int(np.argmax(logits))])
                sent = sum(px.sent for px in proxies) / a.decode
                recv = sum(px.received for px in proxies) / a.decode
                trips = sum(px.round_trips for px in proxies) / a.decode
                wire = f"{sent:11.0f} {recv:11.0f} {trips:15.1f}"
            print(f"{label:24s} {pp:12.1f} {tg:12.1f} {tg / base:6.2f}x {wire}", flush=True)
    finally:
        for s in servers:
            s.close()


if __name__ == "__main__":
    main()
