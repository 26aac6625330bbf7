"""``python -m pyggml info [--json]``: what this installation contains and found."""
from __future__ import annotations

import argparse
import json
import sys

from .info import format_info, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pyggml")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("info", help="ggml version, build, backends and devices")
    i.add_argument("--json", action="store_true", help="print the data as JSON")
    a = p.parse_args(argv)
    data = info()
    print(json.dumps(data, indent=2) if a.json else format_info(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
