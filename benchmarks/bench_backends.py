#!/usr/bin/env python3
"""MiniLM (pyggml.models.bert) on each device of this build, against the CPU backend alone,
side by side: what a device costs or gains end to end (weights on the device, the scheduler
placing nodes, transfers, and for RPC the loopback protocol).

    python benchmarks/bench_backends.py [--threads 2] [--repeat 5] [--device Vulkan0 ...]

By default every device but the CPU is measured, plus ``RPC0``: an RPC server on 127.0.0.1 in a
child process serving the CPU (needs a build with ``rpc``). For Mesa's lavapipe set
``GGML_VK_VISIBLE_DEVICES=0``. The ratio is the device's throughput over the CPU backend's
(> 1: faster). Nothing here is asserted.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from _timing import median_seconds

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [f"Sentence number {i} says something about {w}." for i, w in
             enumerate(["cats", "boats", "bread", "music", "rain", "code", "votes", "bikes"] * 4)]  # 32


def _rate(fn, repeat: int) -> float:
    """Median sentences per second of fn() over ``repeat`` runs (after one warm-up)."""
    return len(SENTENCES) / median_seconds(fn, repeat)


def bench(minilm, model_dir: Path, device: str, threads: int, repeat: int) -> dict[int, float]:
    with minilm.Embedder(model_dir, n_threads=threads, backend=device) as m:
        return {1: _rate(lambda: [m.encode([s]) for s in SENTENCES], repeat),
                32: _rate(lambda: m.encode(SENTENCES, batch_size=32), repeat)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--device", action="append", help="device name (repeatable; default: all but CPU, and RPC0)")
    p.add_argument("--model-dir", type=Path, default=None)
    a = p.parse_args()

    import pyggml
    from pyggml import dl

    from pyggml.models import bert as minilm
    model_dir = a.model_dir or minilm.default_model_dir()
    server = None
    devices = a.device or [d.name for d in pyggml.devices() if d.type != "cpu"]
    if not a.device and dl.status().get("rpc") and dl.status()["rpc"].loaded:
        from pyggml import rpc

        server = rpc.Server(devices=["CPU"], n_threads=a.threads)
        devices.append(rpc.add_server(server.endpoint).devices[0].name)
    try:
        ref = bench(minilm, model_dir, "cpu", a.threads, a.repeat)
        print(f"MiniLM sentences/s, {a.threads} CPU threads, median of {a.repeat}; reference: the CPU backend alone")
        print(f"{'device':<28} {'batch':>5} {'device':>10} {'CPU':>10} {'ratio':>7}")
        for dev in devices:
            desc = pyggml.backends.device.device_by_name(dev).description
            got = bench(minilm, model_dir, dev, a.threads, a.repeat)
            for b in got:
                print(f"{dev + ' (' + desc[:16] + ')':<28} {b:>5} {got[b]:>10.1f} {ref[b]:>10.1f} {got[b] / ref[b]:>6.2f}x")
    finally:
        if server:
            server.close()


if __name__ == "__main__":
    main()
