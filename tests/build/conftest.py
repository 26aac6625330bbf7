"""tests/build tests the build-time package, which only a source checkout has: an installed
wheel tested on its own (scripts/build_wheels.sh) skips them."""
import importlib.util

if importlib.util.find_spec("pyggml_build") is None:
    collect_ignore_glob = ["test_*.py"]
