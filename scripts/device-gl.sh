#!/usr/bin/env bash
# Fetches the graphics loaders the lent GPU machine lacks into .gl/ (git-ignored;
# name it in the run's carry). Dawn there needs libvulkan.so.1 and, for NVIDIA's
# Vulkan driver (its ICD is libGLX_nvidia), the GL vendor-neutral dispatch
# libraries: with libvulkan1 alone vkCreateInstance fails with
# VK_ERROR_INCOMPATIBLE_DRIVER (measured). On the device, before node:
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
#   export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# (docs/gpu.md has the whole command.)
set -euo pipefail
cd "$(dirname "$0")/.."
LISTS=/tmp/tah-amd64-lists
mkdir -p .gl "$LISTS/partial"
o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$LISTS")
apt-get "${o[@]}" update >/dev/null
(cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
ls .gl
