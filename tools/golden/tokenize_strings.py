#!/usr/bin/env python3
"""Tokenizer goldens from llama.cpp for many varied strings.

Makes a fixed list of strings (several hundred: scripts, numbers, code, white space,
emoji, contractions, case runs, combining marks, special-token text, long words,
mixtures, then 400 pseudo-random mixes of the characters the pre-tokenizer regexes tell
apart, from a fixed xorshift sequence, then the character classes of the DeepSeek
pre-tokenizers and 100 mixes of CJK, kana, Hangul, full-width and other characters they
tell apart; the same list on every run), tokenizes each with
llama.cpp (`llamacpp_tokenize.cpp`, built by `llamacpp_run.sh`) and writes, per vocabulary, `loader/tests/data/tokenize/NAME.jsonl`
(no BOS, special-token text tokenized as text) and `NAME-special.jsonl` (special-token
text parsed as special tokens). Each line: `text`, `ids` and `detok` (llama.cpp's
detokenization of those ids). `loader/tests/tokenize_llamacpp.rs` checks Flint's
tokenizer against them.

Vocabularies: llama.cpp's own vocab-only GGUFs from the sdist
(`models/ggml-vocab-{llama-bpe,qwen2,qwen35,gemma-4}.gguf`; the source directory comes
from tools/llamacpp_sdist.sh; also `deepseek-llm`), the Gemma 3 270M file (FLINT_MODEL
or the default-model cache) for the SentencePiece side, and, for the pre-tokenizers no
vocabulary of the sdist carries, an sdist vocabulary copied with another
`tokenizer.ggml.pre` (`rewrite_pre.py`, into a temporary directory; `REWRITES`):
`gpt-4o` and `glm4` on the Llama 3 tokens and merges, `deepseek-v3` on
DeepSeek LLM's.

Usage: tools/golden/tokenize_strings.py [--out DIR] [--list] [--vocab NAME]...
  --list   print the strings as JSON lines and stop (no llama.cpp needed)
  --vocab  only these vocabularies (default: all)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rewrite_pre import rewrite

HERE = Path(__file__).resolve().parent

# Golden vocabularies that are an sdist vocabulary (`models/ggml-vocab-BASE.gguf`) with
# another `tokenizer.ggml.pre`: name -> (BASE, pre-tokenizer). The Rust side builds the
# same ones (`REWRITTEN` in loader/tests/tokenize_llamacpp.rs).
REWRITES = {
    "gpt-4o": ("llama-bpe", "gpt-4o"),
    "glm4": ("llama-bpe", "glm4"),
    "deepseek-v3": ("deepseek-llm", "deepseek-v3"),
}
REPO = HERE.parent.parent


# Characters whose classes the pre-tokenizer regexes tell apart.
POOL = [
    "A", "Z", "a", "s", "t", "d", "l", "e", "R", "V", "Γ", "γ", "ǅ", "日", "1", "9", "٣", "²",
    " ", " ", "\t", "\n", "\r", "\x0b", "\u0301", "\u0308", "'", "'", "/", "!", ".", "\u3000",
    "\u0085", "\u00a0", "😀", "\x00", "\x1c", "_", "-", "ʰ",
]


# Characters the DeepSeek and GLM pre-tokenizers' character classes tell apart: letters
# DeepSeek LLM lists and ones it leaves out, CJK, kana, Hangul, full-width and CJK
# punctuation, curly quotes, ideographic space, symbols, numbers of other scripts.
CJK_POOL = [
    "a", "Z", "é", "ƻ", "ʰ", "Ω", "K", "日", "龦", "あ", "ア", "ゟ", "한", "ㄱ", "。", "、", "「",
    "！", "Ａ", "ｚ", "１", "‘", "“", "…", "\u3000", " ", " ", "\n", "\r", "\t", "1", "٣",
    "😀", ".", "'", "-", "$", "\u0301", "ـ", "℃", "\x00", "ก",
]


def mixes(n=400, pool=POOL, seed=0x2545F4914F6CDD1D):
    """`n` strings of 1 to 24 characters of `pool`, from a fixed xorshift64 sequence."""
    x = seed
    mask = (1 << 64) - 1

    def nxt():
        nonlocal x
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        return x

    out = []
    while len(out) < n:
        t = "".join(pool[nxt() % len(pool)] for _ in range(1 + nxt() % 24))
        if t not in out:
            out.append(t)
    return out


def strings():
    out = []

    def add(*xs):
        for x in xs:
            if x not in out:
                out.append(x)

    # Latin with accents and other European scripts.
    add(
        "Hello world",
        " Hello world",
        "Hello World!",
        "café naïve résumé façade",
        "Äpfel Öl Übermut straße",
        "¿Qué tal? ¡Muy bien!",
        "Łódź, Kraków, Gdańsk",
        "Ærøskøbing og Ålborg",
        "İstanbul ığdır ŞEHİR",
        "Ελληνικά: καλημέρα κόσμε",
        "Русский язык: привет, мир!",
        "Українська: Київ, ґанок, їжак",
        "Ђорђе Шћепановић",
        "Ꭰ Ꮳ Ꮹ (Cherokee)",
        "ǅemal ǈubljana ǋegoš",
        "ﬁnance ﬂow (ligatures)",
        "Ⅻ Ⅳ ⅻ roman numerals",
    )
    # Other scripts.
    add(
        "日本語のテキストです。",
        "中文文本，标点符号！",
        "繁體中文：資料處理",
        "한국어 텍스트입니다.",
        "ひらがな カタカナ 漢字",
        "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
        "مرحبا بالعالم",
        "العربية ١٢٣٤٥ أرقام",
        "עברית: שלום עולם",
        "हिन्दी में पाठ",
        "नमस्ते दुनिया १२३",
        "ภาษาไทยไม่มีช่องว่าง",
        "ພາສາລາວ",
        "தமிழ் உரை",
        "বাংলা লেখা",
        "ქართული ენა",
        "Հայերեն լեզու",
        "አማርኛ ቋንቋ",
        "ᠮᠣᠩᠭᠣᠯ",
        "Tiếng Việt có dấu",
    )
    # Numbers.
    for n in [
        "0", "7", "42", "123", "1234", "12345", "123456", "1234567", "12345678901234567890",
        "3.14159", "0.5", ".5", "5.", "-17", "+3", "1e10", "6.022e23", "1,000", "1,234,567",
        "1.234.567,89", "1 000 000", "12:30:45", "2024-01-15", "v1.2.3", "0x1F", "0b1010",
        "50%", "$1,299.99", "€5", "¥1000", "#123", "1/2", "3½", "²³¹", "①②③", "٣٤٥",
        "१२३", "๑๒๓", "一二三", "1st 2nd 3rd 4th",
    ]:
        add(n, f"The value is {n}.", f" {n} ")
    # Code.
    add(
        "def f(x):\n    return x * 2\n",
        "fn main() {\n\tprintln!(\"{}\", 1 + 2);\n}",
        "int main(void) { return 0; }",
        "#include <stdio.h>\n",
        "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
        "const x = async () => await fetch('/api?q=1&r=2');",
        "SELECT * FROM users WHERE id = 42;",
        "<div class=\"x\">Hello</div>",
        "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
        "x <<= 2; y >>= 3; z **= 4; w //= 5",
        "if a != b && c == d || !e {}",
        "`backticks` and ```fenced```",
        "path/to/file.rs:12:34",
        "https://example.com/a/b?c=d#e",
        "user@example.com",
        "let v: Vec<Option<&'static str>> = vec![];",
        "    indented with four spaces",
        "\tindented with a tab",
        "lambda x: x**2 + 3*x - 1",
        "$ echo $HOME | grep -v '^#'",
        "// comment\n/* block */\n# hash\n-- sql",
        "a_b_c __init__ CamelCase snake_case kebab-case SCREAMING_CASE",
        "\\n \\t \\\\ escaped",
        "~!@#$%^&*()_+`-={}|[]\\:\";'<>?,./",
    )
    # White space.
    add(
        "",
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\n\n",
        "\n\n\n",
        "\r\n",
        "\r\n\r\n",
        "\r",
        " \n",
        "\n ",
        " \t \n ",
        "a  b",
        "a   b",
        "a    b",
        "a\tb",
        "a\t\tb",
        "a\nb",
        "a\n\nb",
        "a\r\nb",
        "a \n b",
        "  leading",
        "trailing  ",
        "   both   ",
        "line1\nline2\n",
        "x\u00a0y",
        "x\u2003y",
        "x\u3000y",
        "x\u200by",
        "x\u2028y",
        "\v\f",
        "end with newline\n",
        " " * 16 + "x",
        "\n" * 6 + "x",
    )
    # Emoji.
    add(
        "😀",
        "emoji 😀🚀 ok",
        "🦙.cpp",
        "👍🏽",
        "👨‍👩‍👧‍👦",
        "🏳️‍🌈",
        "🇫🇷🇯🇵🇺🇸",
        "❤️",
        "✔︎ done",
        "1️⃣ 2️⃣",
        "🧑🏿‍💻 coding",
        "text😀text",
        "😀 😀  😀",
    )
    # Contractions and apostrophes.
    add(
        "It's they're we'll I'M YOU'VE",
        "don't won't can't shouldn't",
        "I'd you'd he'll she's",
        "'quoted' and \"double\"",
        "rock 'n' roll",
        "the '90s",
        "O'Brien's",
        "it’s curly",
        "'s 't 're 've 'm 'll 'd",
        "'S 'T 'RE 'VE 'M 'LL 'D",
        "x's y'S z'Re",
        "''''",
    )
    # Special-token text (parsed as text, or as specials in the second set).
    add(
        "<|begin_of_text|>",
        "<|begin_of_text|>Hello",
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>",
        "a<|endoftext|>b",
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "<bos>text<eos>",
        "<s>[INST] hi [/INST]</s>",
        "<|im_start|> spaced <|im_end|>",
        "<|im_start|><|im_start|>",
        "<|not_a_token|>",
        "<|im_start",
        "<think>\nreasoning\n</think>\n\nanswer",
        "<tool_call>{\"name\": \"f\"}</tool_call>",
        "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    )
    # Long words and runs.
    add(
        "Supercalifragilisticexpialidocious",
        "pneumonoultramicroscopicsilicovolcanoconiosis",
        "Donaudampfschifffahrtsgesellschaftskapitän",
        "a" * 64,
        "ab" * 40,
        "!" * 30,
        "." * 25,
        "-" * 40,
        "=" * 33,
        "#" * 12 + " Title",
        "9" * 50,
        "z" * 200,
        "xX" * 30,
    )
    # Mixed.
    add(
        "Hello, 世界! 123 🚀",
        "café日本123abc",
        "мир123world",
        "A1B2C3",
        "e.g. i.e. etc.",
        "Mr. Smith & Mrs. Jones",
        "“smart quotes” ‘single’",
        "em—dash en–dash",
        "ellipsis… and «guillemets»",
        "math: ∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷",
        "arrows → ← ↑ ↓ ⇒",
        "currency: $ € £ ¥ ₹ ₿",
        "©®™ §¶",
        "tab\tseparated\tvalues\n1\t2\t3",
        "a,b,c\n1,2,3\r\n",
        "What's 2+2? It's 4!",
        "   Hello   World   ",
        "\n\tMixed\r\n whitespace \t\n",
        "ok\u0301 combining",
        "e\u0301 vs é",
        "\u200d zero width joiner",
        "\ufeffBOM at start",
        "control\u0007bell",
        "\u0000nul",
    )
    # Edges of the pre-tokenizers: letters against digits and marks, apostrophes at the
    # ends, line breaks in odd orders, white space around special-token text.
    add(
        "abc123def",
        "x1.5y",
        "l'été d'Artagnan",
        "end'",
        "' s",
        "'",
        "n't",
        "\r\r\n",
        "\n\r",
        " \r\n ",
        "a \r\n\r\n  b",
        "١٢3",
        "3\u0301",
        "\u0301start",
        "word\u200d",
        "x\u00ady",
        "  <|im_end|>  ",
        "\n<|im_start|>\n",
        " <|eot_id|> x",
        "<start_of_turn> model",
        "text <end_of_turn>\n",
        "<|im_start|>system\n<|im_end|>",
        "<unk> <pad> <mask>",
        "[INST] [/INST] <<SYS>>",
        "。、！？「」『』",
        "—–-‐",
        "()[]{}<>",
        "a(b)c[d]e{f}g",
        "!!!abc???",
        "...hello...",
        " \t\t x",
        "\t\n\t\n",
        "ab\n\n\n\ncd",
        "    \n    \n",
        "99 bottles of beer on the wall, 99 bottles of beer.",
        "0000000000",
        "1.0e-10 2.5E+3 -0.0",
        "x=1;y=22;z=333;w=4444",
        "ΑΒΓ αβγ ΆΈΉ",
        "ǲ ǳ Ǳ",
        "İi Iı",
        "ß ẞ",
    )
    # Case runs, combining marks and slashes: what the GPT-4o (upper-case run, then
    # lower-case run, contraction glued on; `[\r\n/]*` after punctuation) and Qwen 3.5
    # (marks count as letters) regexes cut differently.
    add(
        "camelCaseWord PascalCaseWord",
        "HTTPServer XMLHttpRequest getHTTPResponseCode",
        "iPhone iPad macOS eBay YouTube GitHub",
        "McDonald's O'NEIL'S DON'T You'RE it'S",
        "ABCdef abcDEF aBcDeF ABC'S Abc'sDef",
        "JSONs HTML5 h2O CO2 x86_64 GPT-4o utf8Decode",
        "snake_Case_Mix UPPER_lower Title_Case",
        "ΑΒΓαβγ ΆλφαΒήτα ΣΊΣΥΦΟΣ",
        "МОСКВАмосква MоскваTEST",
        "日本Japan テストTest ÉCOLE école ñÑnN",
        "ʰʲʷ modifier letters ˈstres",
        "e\u0301E\u0301 A\u0301BC \u0301\u0301\u0301",
        "café\u0301s naïve\u0308",
        "مَرْحَبًا بِكُمْ",
        "שָׁלוֹם עוֹלָם",
        "Z\u0324\u0354\u0367\u0311a\u0308\u0356\u036dl\u036e\u0312g\u030co\u0319",
        "x\u20dd y\u20e3",
        " \u0301x",
        "1\u0301 2\u0308",
        "'\u0301s",
        "\u0915\u094d\u0937 \u0BA4\u0BAE\u0BBF\u0BB4\u0BCD",
        "a/b//c d/ /e",
        "!/\n/x",
        "http://x.y/z/ ftp://a//",
        ")//\n",
        "?/\r\n/",
        "ABC123def456 1st2ND3rd",
        " Hello WORLD wORLD HeLLo",
        "\tTab\nNew\rCarriage",
        "I'M YOU'LL WE'D THEY'VE",
        "ALLCAPS'll lower'LL",
    )
    # Systematic combinations: a word, a separator, another piece.
    words = ["hello", "Hello", "HELLO", "día", "мир", "世界", "123", "3.5", "😀", "x_y", "'s", "<|im_end|>"]
    seps = ["", " ", "  ", "\n", "\t", ", ", ". ", "-", "\r\n"]
    i = 0
    for a in words:
        for s in seps:
            b = words[(i * 7 + 3) % len(words)]
            add(a + s + b)
            i += 1
    # A paragraph.
    add(
        "The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon; "
        "the crew (3 people) returned on July 24th. It's been 55+ years!\n\nNext paragraph.",
    )
    # Pseudo-random mixes of the characters the pre-tokenizer regexes tell apart.
    add(*mixes())
    # The character classes of the DeepSeek pre-tokenizers (and GLM's Llama 3 regex on
    # the same text): the letters DeepSeek LLM lists and their neighbours it leaves out,
    # full-width and CJK punctuation, kana and Hangul, the ideographic space, letters next
    # to punctuation, numbers next to CJK, trailing white space.
    add(
        "ƻƼ ʔʕ ʯʰ µ ß ÿ ŉ",
        "Ωhm Kelvin ℃ ℌℑ ℵ ⅎ Ↄↄ ℮",
        "𐐀𐐨 𐒰𐓘 𞤀𞤢 𑢠",
        "Ά Έ Ή ᾳ ῼ ι ΐ",
        "ꙀꙁꙂ ꜢꜣꜤ ꭰꭱ ﬀﬁ ﬓﬔ Ⰰⰰ ⲀⲁⳤⳫ",
        "ᏸᏹ ᲐᲑ ᴀᴁ ᵫᵬ ᶚ ᵸ",
        "ＡＢＣ！？（注）：；～ ｆｕｌｌ",
        "‘single’ “double” „low‟ ‹angle›",
        "「引用」『二重』〈括弧〉【強調】",
        "日本語　全角スペース。句点、読点",
        "ぁゟ゠ヿ ㇰ ｦｧ ㄅㄆ",
        "한국어와 日本語と中文",
        "龥龦 㐀 𠀀 豈",
        "ࠀ ߿ ꀀ ꓐ",
        "第1章 2024年3月15日 ３月",
        "价格：¥１２３４.５６元",
        "abc中文def日本ghi",
        "中文,English;日本語.",
        " 中文  日本  ",
        "\u3000\u3000indented",
        "x\u3000\u3001y",
        "a\u180eb \ufeffc d\u200be",
        "'Hello' \"World\" (x) [y] {z} <w>",
        "!abc .com ?Query #tag @user $var %mod ^caret ~tilde `tick",
        "¡Hola! ¿Qué? «Ça» —dash— …end",
        "x1y22z333w4444v55555",
        "٣٤٥abc١٢ ١٢٣٤ ¹²³",
        "e\u0301\u0302 \u0301a 1\u0301 !\u0301 日\u0301",
        "\x00abc \x01\x02 def\x7f",
        "trailing spaces   ",
        "trailing tab\t",
        "trailing ideographic\u3000",
        "line\r\n\r\nbreaks \n \r",
        "ไทย ลาว ខ្មែរ",
    )
    add(*mixes(100, CJK_POOL, 0x9E3779B97F4A7C15))
    return out


def llama_src():
    env = os.environ.get("FLINT_LLAMACPP_SRC")
    if env:
        return Path(env)
    r = subprocess.run(
        [str(REPO / "tools/llamacpp_sdist.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(r.stdout.strip().splitlines()[-1])


def gemma_model():
    env = os.environ.get("FLINT_MODEL")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "flint/gemma-3-270m-q4_k_m.gguf"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "loader/tests/data/tokenize"))
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--vocab", action="append", default=[])
    args = ap.parse_args()

    texts = strings()
    if args.list:
        for t in texts:
            print(json.dumps({"text": t}, ensure_ascii=False))
        return
    src = llama_src()
    with tempfile.TemporaryDirectory() as tmp:
        vocabs = {
            "llama-bpe": src / "models/ggml-vocab-llama-bpe.gguf",
            "qwen2": src / "models/ggml-vocab-qwen2.gguf",
            "gemma3": gemma_model(),
            "qwen35": src / "models/ggml-vocab-qwen35.gguf",
            "gemma-4": src / "models/ggml-vocab-gemma-4.gguf",
            "deepseek-llm": src / "models/ggml-vocab-deepseek-llm.gguf",
        }
        vocabs.update({name: Path(tmp) / f"ggml-vocab-{name}.gguf" for name in REWRITES})
        unknown = [v for v in args.vocab if v not in vocabs]
        if unknown:
            sys.exit(f"tokenize_strings.py: unknown vocabulary {unknown} (known: {list(vocabs)})")
        if args.vocab:
            vocabs = {k: v for k, v in vocabs.items() if k in args.vocab}
        for name, (base, pre) in REWRITES.items():
            if name in vocabs:
                rewrite(src / f"models/ggml-vocab-{base}.gguf", vocabs[name], pre)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        inp = Path(tmp) / "in.jsonl"
        inp.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts))
        for name, vocab in vocabs.items():
            if not vocab.is_file():
                sys.exit(f"tokenize_strings.py: {vocab} is missing")
            for suffix, flags in [("", []), ("-special", ["--parse-special"])]:
                dest = out / f"{name}{suffix}.jsonl"
                subprocess.run(
                    [str(HERE / "llamacpp_run.sh"), "llamacpp_tokenize", str(vocab), str(inp), str(dest)] + flags,
                    check=True,
                )
                n = sum(1 for _ in dest.open())
                if n != len(texts):
                    sys.exit(f"tokenize_strings.py: {dest} has {n} lines, expected {len(texts)}")
    print(f"tokenize_strings.py: {len(texts)} strings x {len(vocabs)} vocabularies x 2 into {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
