"""What every build step shares: the error type, progress lines and running a command."""
from __future__ import annotations

import shlex
import subprocess

__all__ = ["BuildError", "log", "run"]


class BuildError(RuntimeError):
    """A build step failed; the message says which and why."""


def log(msg: str) -> None:
    """One progress line, ``[build_ggml] msg``, flushed at once (pip -v shows it live)."""
    print(f"[build_ggml] {msg}", flush=True)


def run(cmd: list[str], **kw: object) -> None:
    """Run ``cmd`` (printed first); BuildError if it fails."""
    log("$ " + shlex.join(cmd))
    try:
        subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]
    except subprocess.CalledProcessError as e:
        raise BuildError(f"command failed with exit code {e.returncode}: {shlex.join(cmd)}") from None
