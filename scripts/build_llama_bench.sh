#!/usr/bin/env bash
# Build llama.cpp's own benchmark, llama-bench (that target only), for benchmarks/bench_llama.py.
#
#   scripts/build_llama_bench.sh            # -> build/llama.cpp/build/bin/llama-bench
#
# The source is the llama.cpp vendored in the PyPI source distribution
# llama_cpp_python-0.3.36.tar.gz (its vendor/llama.cpp/), fetched from the package index
# (PIP_INDEX_URL is honoured) by build_ggml.py's own downloader, checked against a pinned sha256
# (a mismatch is a hard error) and cached in ~/.cache/pyggml (PYGGML_CACHE_DIR), like pyggml's
# ggml sdist. Everything goes under build/llama.cpp/ (ignored by git); nothing of it is committed.
#
# CPU only, tuned for this machine (GGML_NATIVE=ON) as pyggml's default build is, static
# libraries, no curl, Release. Extra CMake options: CMAKE_ARGS="..." (they come last and win).
set -euo pipefail
cd "$(dirname "$0")/.."

SDIST_PROJECT=llama-cpp-python
SDIST_FILENAME=llama_cpp_python-0.3.36.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
OUT=build/llama.cpp
PYTHON=${PYTHON:-python3}

sdist=$("$PYTHON" - "$SDIST_PROJECT" "$SDIST_FILENAME" "$SDIST_SHA256" <<'PY'
import contextlib, os, sys
from pathlib import Path
sys.path.insert(0, os.getcwd())
import build_ggml   # its pinned-download helper: one downloader for the project
project, filename, sha256 = sys.argv[1:4]
cache = Path(os.environ.get("PYGGML_CACHE_DIR", Path.home() / ".cache" / "pyggml"))
with contextlib.redirect_stdout(sys.stderr):   # its log goes to stdout
    path = build_ggml._fetch_pinned(project, filename, sha256, cache)
print(path)
PY
)

src="$OUT/src"
if [ "$(cat "$src/.sdist-sha256" 2>/dev/null)" != "$SDIST_SHA256" ]; then
    echo "[build_llama_bench] unpacking vendor/llama.cpp from $sdist into $src"
    rm -rf "$src" "$OUT/tmp"
    mkdir -p "$OUT/tmp"
    top=${SDIST_FILENAME%.tar.gz}   # the sdist's top folder
    tar -xzf "$sdist" -C "$OUT/tmp" "$top/vendor/llama.cpp"
    mv "$OUT/tmp/$top/vendor/llama.cpp" "$src"
    rm -rf "$OUT/tmp"
    echo "$SDIST_SHA256" > "$src/.sdist-sha256"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# shellcheck disable=SC2086
cmake -S "$src" -B "$OUT/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON ${CMAKE_ARGS:-} >/dev/null
t0=$SECONDS
cmake --build "$OUT/build" --target llama-bench -j "${JOBS:-2}"
echo "[build_llama_bench] built $OUT/build/bin/llama-bench in $((SECONDS - t0)) s"
"$OUT/build/bin/llama-bench" --help 2>&1 | head -1 || true
