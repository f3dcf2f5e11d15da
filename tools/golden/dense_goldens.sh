#!/usr/bin/env bash
# llama.cpp goldens for the dense families (llama, qwen2, qwen3, gemma3) and the MoE families
# (qwen3moe, glm4moe, mimo2, gpt-oss), gemma4 and qwen35moe on synthetic files.
#
# For each case (ARCH PRESET SEED VOCAB VOCAB_SIZE N_TOKENS, table below) it
#   1. writes MODEL.f32.gguf with `flint synth --arch ARCH --preset PRESET --seed SEED
#      --vocab VOCAB.gguf --vocab-size VOCAB_SIZE` (the tokenizer taken from a vocabulary
#      GGUF, truncated; VOCAB `builtin`: no --vocab, synth's own byte-level BPE of the
#      preset's size, for families whose vocabulary the sdist lacks: glm4moe), into a
#      scratch folder: synth regenerates it bit for bit;
#   2. quantizes it with llama.cpp's own llama-quantize to the case's QUANTS (Q8_0 and
#      Q4_K_M; for gpt-oss MXFP4_MOE: MXFP4 experts, the other matrices Q8_0);
#   3. makes the token ids: a fixed text (text() below) tokenized by llama-tokenize with
#      the f32 file's vocabulary (BOS added), cut to N_TOKENS;
#   4. runs llamacpp_logits (llamacpp_logits.cpp) on each of the three files: teacher-
#      forced logits at every STRIDE-th position, and greedy chains from three prompts
#      (prefixes of the ids: 8, 32 and 128 tokens), 32 steps each;
# and writes into OUT_ROOT/ARCH-PRESET/:
#   ids.json                       {"text": the text, "ids": its first N_TOKENS ids}
#   logits-{f32,Q...}.json         llamacpp_logits format (with "start", "stride", "pos"),
#                                  for the f32 file and each of the case's QUANTS
#   greedy-{f32,Q...}.jsonl        greedy.jsonl format
#   model-Q.gguf                   the quantized files (CI cannot build llama.cpp)
#   manifest.json                  the case, the commands' parameters, sha256 of every
#                                  model file (f32 included) and the count of its
#                                  tensors per type, llama.cpp's version and the SIMD
#                                  level of its build (`llamacpp_simd`: avx2, avx512 or
#                                  avx512_vnni)
# The split case (SPLIT_CASE) also gets model-q8_0-0000K-of-0000N.gguf from
# `llama-gguf-split --split --split-max-tensors SPLIT_TENSORS` of model-q8_0.gguf, and the
# script checks that llama.cpp's logits on the split equal those on the single file.
#
# Usage: tools/golden/dense_goldens.sh [ARCH-PRESET ...]      (default: every case)
# Environment:
#   FLINT_SYNTH   the synth command (default: `FLINT_BIN synth`, FLINT_BIN defaulting to
#                 target/release/flint, built with cargo when missing)
#   OUT_ROOT      output folder (default engine/tests/data/families)
#   WORK          scratch folder for the f32 files (default: a temporary folder)
#   STRIDE        teacher-forced positions kept (default 8)
#   THREADS       llama.cpp threads (default 2)
# llama.cpp comes from tools/bench/build_llamacpp.sh (a no-op once built).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
die() {
    echo "dense_goldens.sh: error: $*" >&2
    exit 1
}
note() {
    echo "dense_goldens.sh: $*" >&2
}

# QUANTS: the llama-quantize types made and kept for the case ("-": the f32 file alone;
# tiny-27b's 62 layers would take 15-25 MB per quantized file).
#     ARCH   PRESET    SEED VOCAB      VOCAB_SIZE N_TOKENS QUANTS
CASES=(
    "llama   tiny      11   llama-bpe  2048       2048     q8_0,q4_k_m"
    "qwen2   tiny      12   qwen2      2048       2048     q8_0,q4_k_m"
    "qwen3   tiny      13   qwen2      2048       2048     q8_0,q4_k_m"
    "gemma3  tiny      14   gemma3     2048       2048     q8_0,q4_k_m"
    "gemma3  tiny-4b   15   gemma3     2048       2048     q8_0,q4_k_m"
    "gemma3  tiny-27b  16   gemma3     2048       2048     -"
    "qwen3moe tiny      21   qwen2      2048       2048     q8_0,q4_k_m"
    "qwen3moe tiny-bias 22   qwen2      2048       2048     q4_k_m"
    "glm4moe tiny       23   builtin    2048       2048     q8_0,q4_k_m"
    "glm4moe tiny-nextn 24   builtin    2048       2048     q4_k_m"
    "mimo2   tiny       25   qwen2      2048       2048     q8_0,q4_k_m"
    "mimo2   tiny-nextn 26   qwen2      2048       2048     q4_k_m"
    "gpt-oss tiny       27   llama-bpe  2048       2048     q8_0,mxfp4_moe"
    "gemma4  tiny       31   gemma-4    2048       2048     q8_0,q4_k_m"
    "gemma4  tiny-e2b   32   gemma-4    2048       2048     q8_0,q4_k_m"
    "qwen35moe tiny     41   qwen35     2048       2048     q8_0,q4_k_m"
)
SPLIT_CASE="llama-tiny"
SPLIT_TENSORS=8
GREEDY_PREFIXES=(8 32 128)
GREEDY_STEPS=32

out_root="${OUT_ROOT:-$repo/engine/tests/data/families}"
stride="${STRIDE:-8}"
threads="${THREADS:-2}"

bindir="$("$repo/tools/bench/build_llamacpp.sh" | tail -n1)"
# The SIMD level of that build (it follows this CPU): llama.cpp's float order depends on
# it, and Flint's device follows the AVX-512 build's order (engine/tests/families.rs).
cache="$(dirname "$bindir")/CMakeCache.txt"
llamacpp_simd=avx2
if grep -q '^GGML_AVX512:BOOL=ON' "$cache" 2>/dev/null; then
    llamacpp_simd=avx512
    grep -q '^GGML_AVX512_VNNI:BOOL=ON' "$cache" && llamacpp_simd=avx512_vnni
fi
src="$("$repo/tools/llamacpp_sdist.sh" | tail -n1)"
quantize="$bindir/llama-quantize"
tokenize="$bindir/llama-tokenize"
gguf_split="$bindir/llama-gguf-split"
run="$here/llamacpp_run.sh"

if [[ -n "${FLINT_SYNTH:-}" ]]; then
    read -r -a synth <<<"$FLINT_SYNTH"
else
    flint="${FLINT_BIN:-$repo/target/release/flint}"
    if [[ ! -x "$flint" ]]; then
        note "building $flint"
        (cd "$repo" && nice cargo build --release -p flint-engine --bin flint >&2)
    fi
    synth=("$flint" synth)
fi

vocab_file() {
    case "$1" in
        llama-bpe | qwen2 | gemma-4 | qwen35) echo "$src/models/ggml-vocab-$1.gguf" ;;
        gemma3) echo "${FLINT_GEMMA3_VOCAB:-${XDG_CACHE_HOME:-$HOME/.cache}/flint/gemma-3-270m-q4_k_m.gguf}" ;;
        builtin) echo builtin ;;
        *) die "unknown vocabulary '$1'" ;;
    esac
}

# The text the ids come from: prose, code, numbers and a few other scripts, chosen by a
# fixed linear congruential sequence, so every run writes the same text.
text() {
    python3 - <<'PY'
parts = [
    "The quick brown fox jumps over the lazy dog.",
    "In 1969, Apollo 11 landed on the Moon after a journey of 384,400 km.",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += x[i] * y[i]; }",
    "Rivers carve valleys slowly, grain by grain, over millions of years.",
    "She said, \"It's not what you think,\" and walked away.",
    "Prices rose 3.7% in March, the fastest pace since 2022.",
    "Le café est très chaud ce matin.",
    "Der Zug fährt um 14:35 Uhr ab.",
    "Москва — столица России.",
    "東京は日本の首都です。",
    "A list: apples, oranges, pears; and then nothing else.",
    "SELECT name, age FROM people WHERE age > 30 ORDER BY name;",
    "The mitochondria is the powerhouse of the cell.",
    "Water boils at 100 degrees Celsius at sea level.",
    "\n\n",
    "    indented line with four spaces\n",
    "Why? Because the answer, as always, is 42!",
    "Mathematics: e^(i*pi) + 1 = 0, and sqrt(2) is about 1.41421356.",
    "Once upon a time, in a small village, there lived an old clockmaker.",
]
x = 12345
out = []
for _ in range(500):
    x = (1103515245 * x + 12345) % 2**31
    out.append(parts[x % len(parts)])
print(" ".join(out), end="")
PY
}

json_ids() {
    python3 -c 'import json, sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["ids"][: int(sys.argv[2])])))' "$1" "$2"
}

work="${WORK:-}"
if [[ -z "$work" ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

wanted=("$@")
selected() {
    [[ ${#wanted[@]} -eq 0 ]] && return 0
    local w
    for w in "${wanted[@]}"; do [[ "$w" == "$1" ]] && return 0; done
    return 1
}

done_any=0
for line in "${CASES[@]}"; do
    read -r arch preset seed vocab vocab_size n_tokens quants <<<"$line"
    IFS=, read -r -a quant_list <<<"${quants/#-/}"
    name="$arch-$preset"
    selected "$name" || continue
    done_any=1
    note "== $name"
    dest="$out_root/$name"
    mkdir -p "$dest"
    vf="$(vocab_file "$vocab")"
    vocab_args=()
    if [[ "$vf" != builtin ]]; then
        [[ -f "$vf" ]] || die "vocabulary $vf is missing (tools/llamacpp_sdist.sh fetches the sdist's)"
        vocab_args=(--vocab "$vf" --vocab-size "$vocab_size")
    fi

    f32="$work/$name.f32.gguf"
    "${synth[@]}" --arch "$arch" --preset "$preset" --seed "$seed" --out "$f32" \
        "${vocab_args[@]}" >&2 || die "synth failed for $name"
    rm -f "$dest"/model-*.gguf "$dest"/logits-*.json "$dest"/greedy-*.jsonl
    for q in "${quant_list[@]}"; do
        nice "$quantize" "$f32" "$dest/model-$q.gguf" "${q^^}" "$threads" >"$work/$name.$q.log" 2>&1 ||
            die "llama-quantize ${q^^} failed for $name (log: $work/$name.$q.log)"
    done

    text >"$work/$name.txt"
    "$tokenize" -m "$f32" -f "$work/$name.txt" --ids --no-escape --log-disable >"$work/$name.ids" 2>"$work/$name.tok.log" ||
        die "llama-tokenize failed for $name (log: $work/$name.tok.log)"
    python3 - "$work/$name.txt" "$work/$name.ids" "$n_tokens" "$dest/ids.json" <<'PY' || die "ids for $name"
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
ids = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
n = int(sys.argv[3])
if len(ids) < n:
    sys.exit(f"the text gives only {len(ids)} tokens, {n} wanted")
json.dump({"text": text, "ids": ids[:n]}, open(sys.argv[4], "w"), ensure_ascii=False, separators=(",", ":"))
PY
    : >"$work/$name.prompts"
    for p in "${GREEDY_PREFIXES[@]}"; do json_ids "$dest/ids.json" "$p" >>"$work/$name.prompts"; done

    for q in f32 "${quant_list[@]}"; do
        m="$dest/model-$q.gguf"
        [[ $q == f32 ]] && m="$f32"
        "$run" llamacpp_logits "$m" logits "$dest/ids.json" "$dest/logits-$q.json" \
            --stride "$stride" --threads "$threads"
        "$run" llamacpp_logits "$m" greedy "$work/$name.prompts" "$dest/greedy-$q.jsonl" \
            --steps "$GREEDY_STEPS" --threads "$threads"
    done

    split_files=()
    if [[ "$name" == "$SPLIT_CASE" ]]; then
        [[ -f "$dest/model-q8_0.gguf" ]] || die "the split case $name needs q8_0 in its QUANTS"
        nice "$gguf_split" --split --split-max-tensors "$SPLIT_TENSORS" "$dest/model-q8_0.gguf" \
            "$dest/model-q8_0" >"$work/$name.split.log" 2>&1 ||
            die "llama-gguf-split failed (log: $work/$name.split.log)"
        mapfile -t split_files < <(cd "$dest" && ls model-q8_0-0*-of-0*.gguf)
        [[ ${#split_files[@]} -ge 2 ]] || die "llama-gguf-split made ${#split_files[@]} file(s); lower SPLIT_TENSORS"
        "$run" llamacpp_logits "$dest/${split_files[0]}" logits "$dest/ids.json" "$work/split.json" \
            --stride "$stride" --threads "$threads"
        cmp -s "$work/split.json" "$dest/logits-q8_0.json" ||
            die "llama.cpp's logits on the split $name differ from the single file's"
        note "split into ${#split_files[@]} files; llama.cpp's logits equal the single file's"
    fi

    python3 - "$dest" "$f32" "$arch" "$preset" "$seed" "$vocab" "$vocab_size" "$n_tokens" "$stride" \
        "$(basename "$(dirname "$src")")" "${GREEDY_PREFIXES[*]}" "$GREEDY_STEPS" "${quant_list[*]}" \
        "$llamacpp_simd" "${split_files[@]}" <<'PY'
import collections, hashlib, json, os, sys
import gguf
dest, f32, arch, preset, seed, vocab, vocab_size, n_tokens, stride, sdist, prefixes, steps, quants, simd, *split = sys.argv[1:]
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()
def types(p):
    return dict(sorted(collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(p).tensors).items()))
files = {"f32": {"synth": True, "bytes": os.path.getsize(f32), "sha256": sha(f32), "tensor_types": types(f32)}}
for q in quants.split():
    p = os.path.join(dest, f"model-{q}.gguf")
    files[q] = {"file": f"model-{q}.gguf", "bytes": os.path.getsize(p), "sha256": sha(p), "tensor_types": types(p)}
m = {
    "arch": arch, "preset": preset, "seed": int(seed),
    "synth": f"flint synth --arch {arch} --preset {preset} --seed {seed}" + ("" if vocab == "builtin" else f" --vocab VOCAB --vocab-size {vocab_size}"),
    "vocab": vocab, "vocab_size": int(vocab_size), "n_tokens": int(n_tokens), "stride": int(stride),
    "greedy_prefixes": [int(x) for x in prefixes.split()], "greedy_steps": int(steps),
    "llamacpp": f"{sdist} (PyPI sdist), CPU: llama-quantize, llama-tokenize, tools/golden/llamacpp_logits.cpp",
    "llamacpp_simd": simd,
    "models": files,
}
if split:
    m["split"] = {"of": "q8_0", "files": [{"file": s, "sha256": sha(os.path.join(dest, s))} for s in split]}
json.dump(m, open(os.path.join(dest, "manifest.json"), "w"), indent=1)
PY
    note "$name: $(du -sh "$dest" | cut -f1) in $dest"
done
if [[ $done_any == 0 ]]; then
    names=()
    for line in "${CASES[@]}"; do
        read -r arch preset _ <<<"$line"
        names+=("$arch-$preset")
    done
    die "no case named ${wanted[*]} (cases: ${names[*]})"
fi
