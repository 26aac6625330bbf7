#!/usr/bin/env bash
# Build llama.cpp's own benchmark, llama-bench (that target only), for benchmarks/bench_llama.py.
#
#   scripts/build_llama_bench.sh            # -> build/llama.cpp/build/bin/llama-bench
#
# The source is the llama.cpp vendored in the PyPI source distribution that pyggml's ggml 0.25.3
# comes from, llama_cpp_python-0.3.36.tar.gz (its vendor/llama.cpp/): the archive and its sha256
# are those of pyggml_build/pins.py (PINS["0.25.3"]), fetched from the package index
# (PIP_INDEX_URL is honoured) by the build's own downloader (pyggml_build.source.fetch_pinned),
# checked against the pinned sha256 (a mismatch is a hard error) and cached in ~/.cache/pyggml
# (PYGGML_CACHE_DIR), like pyggml's ggml source. Everything goes under build/llama.cpp/ (ignored
# by git); nothing of it is committed.
#
# CPU only, tuned for this machine (GGML_NATIVE=ON) as pyggml's default build is, static
# libraries, no curl, Release. Extra CMake options: CMAKE_ARGS="..." (they come last and win).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=build/llama.cpp
PYTHON=${PYTHON:-python3}

# prints: the archive's path, its sha256, its file name
read -r sdist SDIST_SHA256 SDIST_FILENAME < <("$PYTHON" - <<'PY'
import contextlib, os, sys
sys.path.insert(0, os.getcwd())
from pyggml_build.pins import PINS
from pyggml_build.source import cache_dir, fetch_pinned
archive = PINS["0.25.3"].archive
assert archive.project == "llama-cpp-python", archive
with contextlib.redirect_stdout(sys.stderr):   # the build's log goes to stdout
    path = fetch_pinned(archive.project, archive.filename, archive.sha256, cache_dir())
print(path, archive.sha256, archive.filename)
PY
)
[ -n "${SDIST_FILENAME:-}" ] || { echo "[build_llama_bench] could not get the llama.cpp source" >&2; exit 1; }

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
