"""Trial runs in a forked child process, for ggml calls pyggml has no explicit checks for.

ggml reacts to misuse with ``GGML_ASSERT`` -> ``abort()``. Where pyggml cannot check the
conditions itself (the less common op constructors, their kernels), it runs the call first in a
``fork()``-ed copy of the process: if the copy dies, the parent raises ValueError with ggml's
message and nothing happened to it.
"""
from __future__ import annotations

import faulthandler
import os
import select
import signal
import time
from typing import Callable

__all__ = ["trial"]


def trial(fn: Callable[[], object], timeout: float = 30.0) -> str | None:
    """Run ``fn()`` in a forked child. None if it returned (or raised a Python exception);
    otherwise what the child printed before it died (ggml's assert message)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        try:
            # ggml's own message is the answer; Python's fault handler (python -X faulthandler,
            # pytest) would print a "Fatal Python error" dump over it
            faulthandler.disable()
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            fn()
        except BaseException:  # noqa: BLE001 - a Python exception is not a crash
            pass
        os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                chunks.append(b"(no answer: killed)")
                break
            data = os.read(r, 65536)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return None
    text = b"".join(chunks).decode("utf-8", "replace").strip()
    lines = [ln for ln in text.splitlines() if "GGML_ASSERT" in ln or "error" in ln.lower()]
    return (lines[-1] if lines else text[-500:]) or f"killed by signal {os.WTERMSIG(status)}"
