#!/usr/bin/env bash
# Install what ggml-vulkan needs to build and run on Debian 12 (bookworm), without touching the
# system's apt sources:
#   - from bookworm: glslc, spirv-headers, the Vulkan loader, and Mesa's lavapipe (a software
#     Vulkan device on the CPU, for tests on machines with no GPU);
#   - from trixie: the Vulkan headers >= 1.3.261 that ggml-vulkan needs (VK_EXT_layer_settings).
#     bookworm's libvulkan-dev is 1.3.239 and fails to compile ggml-vulkan. The trixie .deb is only
#     unpacked into a private prefix (default: ~/.cache/pyggml/vulkan-headers); nothing is installed.
# Prints the prefix; build with:  PYGGML_BACKENDS=cpu,vulkan PYGGML_VULKAN_PREFIX=<prefix> ...
# (build_ggml.py also looks in the default prefix by itself).
set -euo pipefail
prefix="${PYGGML_VULKAN_PREFIX:-${PYGGML_CACHE_DIR:-$HOME/.cache/pyggml}/vulkan-headers}"
need_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

export DEBIAN_FRONTEND=noninteractive
if ! dpkg -s glslc spirv-headers libvulkan1 mesa-vulkan-drivers >/dev/null 2>&1; then
    need_root apt-get update -qq
    need_root apt-get install -y -qq glslc spirv-headers libvulkan1 mesa-vulkan-drivers >/dev/null
fi

if [ ! -f "$prefix/usr/include/vulkan/vulkan_core.h" ]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/lists/partial" "$work/archives/partial"
    cat > "$work/trixie.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$work/parts"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives"
          -o "APT::Architecture=amd64" -o "Debug::NoLocking=1")
    mkdir -p "$work/parts" && cp "$work/trixie.sources" "$work/parts/"
    apt-get "${opts[@]}" update -qq
    (cd "$work" && apt-get "${opts[@]}" download libvulkan-dev >/dev/null)
    mkdir -p "$prefix"
    dpkg-deb -x "$work"/libvulkan-dev_*.deb "$prefix"
fi
grep -m1 "define VK_HEADER_VERSION " "$prefix/usr/include/vulkan/vulkan_core.h" >&2
echo "$prefix"
