#!/usr/bin/env bash
# The vk backend on a machine with a real GPU: what `flint devices` finds, the conformance
# suite (doubles and the f32 variants), and `flint bench --device vk` beside the cpu device
# on two synthetic files (llama bench preset: a ~1B dense model; qwen3moe bench preset).
# No step stops the rest; each step's output is appended to $OUT/full.log (default /tmp/vk-gpu).
#
#   tools/bench/vk_gpu_check.sh [BIN_DIR]      # BIN_DIR holds flint and flint-conformance
#                                              # (default target/release)
#
# The machine needs the Vulkan loader (libvulkan.so.1) and the GPU driver's ICD. Where the
# loader is missing, unpack Debian's libvulkan1 .deb (`apt-get download libvulkan1`,
# `dpkg -x libvulkan1_*.deb /`, `ldconfig`); where the NVIDIA ICD is not in the loader's
# search path, the script points VK_DRIVER_FILES at /usr/local/nvidia/share/vulkan/icd.d
# (the NVIDIA container toolkit's location; the container needs graphics capabilities).
set -u
B="${1:-target/release}"
OUT="${OUT:-/tmp/vk-gpu}"
mkdir -p "$OUT"
log() { printf '\n==> %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
step() { # name timeout command...
    local name=$1 t=$2
    shift 2
    log "$name"
    timeout "$t" "$@" >"/tmp/vk-gpu-$name.txt" 2>&1
    local rc=$?
    cat "/tmp/vk-gpu-$name.txt" >>"$OUT/full.log"
    echo "rc=$rc"
    tail -n "${TAILN:-25}" "/tmp/vk-gpu-$name.txt"
}
log host
uname -srm
grep -m1 "model name" /proc/cpuinfo
nproc
command -v nvidia-smi >/dev/null && nvidia-smi -L
ldconfig -p | grep -i libvulkan || echo "no Vulkan loader on the library path"
if ! ls /usr/share/vulkan/icd.d/*nvidia* /etc/vulkan/icd.d/*nvidia* >/dev/null 2>&1 &&
    [ -e /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    echo "VK_DRIVER_FILES=$VK_DRIVER_FILES"
fi
# The two files are written while the conformance suite runs.
("$B/flint" synth --arch llama --preset bench --out /tmp/vk-gpu-llama.gguf --seed 1 >/tmp/vk-gpu-synth.txt 2>&1
    "$B/flint" synth --arch qwen3moe --preset bench --out /tmp/vk-gpu-qwen3moe.gguf --seed 1 >>/tmp/vk-gpu-synth.txt 2>&1) &
synth=$!
step devices 30 "$B/flint" devices
step conformance 300 "$B/flint-conformance" --device vk
TAILN=12 step conformance_f32 300 env FLINT_VK_F64=0 "$B/flint-conformance" --device vk
log synth
wait "$synth"
tail -n 4 /tmp/vk-gpu-synth.txt
for m in llama qwen3moe; do
    for d in vk cpu; do
        TAILN=12 step "bench_${m}_$d" 300 "$B/flint" bench -m "/tmp/vk-gpu-$m.gguf" --device "$d" \
            --decode-tokens 64 --aggregate-tokens 16
    done
done
log end
