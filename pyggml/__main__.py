"""``python -m pyggml info [--json]``: what this installation contains and found."""
from __future__ import annotations

import argparse
import json
import os
import sys

from .backends.info import format_info, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pyggml")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("info", help="ggml version, build, backends and devices")
    i.add_argument("--json", action="store_true", help="print the data as JSON")
    a = p.parse_args(argv)
    data = info()
    try:
        print(json.dumps(data, indent=2) if a.json else format_info(data), flush=True)
    except BrokenPipeError:  # `python -m pyggml info | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
