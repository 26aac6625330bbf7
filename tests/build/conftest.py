"""The build-time package ``pyggml_build`` lives next to the package in the checkout (it is not
installed): make it importable. Appended, so that an installed pyggml still wins over the
source tree's."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
