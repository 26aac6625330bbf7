"""``python -m pyggml.module build ...`` under its older name: :mod:`pyggml.impl.module`."""
import sys

from .impl.module import build_module, main

__all__ = ["build_module", "main"]

if __name__ == "__main__":
    sys.exit(main())
