// llamacpp_pretokenize: the words llama.cpp's BPE pre-tokenizer cuts many strings into.
//
// Usage: llamacpp_pretokenize REGEXES.json IN.jsonl OUT.jsonl
//   REGEXES.json: a JSON array of the regex strings of one pre-tokenizer, in order, as
//   llama.cpp's llm_tokenizer_bpe lists them for it (tools/golden/pretokenize_splits.py
//   takes them from the sdist's src/llama-vocab.cpp).
//   IN.jsonl: one JSON object per line with a "text" string.
//   OUT.jsonl: the same lines with "words": unicode_regex_split(text, regexes) without
//   the GPT-2 byte encoding, i.e. the pieces of the text itself (invalid UTF-8 would
//   become U+FFFD).
// Links libllama for unicode_regex_split (src/unicode.h, not a public header), so the
// custom splitters and the std::regex fallback on collapsed text are llama.cpp's own.
// Built by llamacpp_run.sh.

#include "unicode.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

using json = nlohmann::ordered_json;

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s REGEXES.json IN.jsonl OUT.jsonl\n", argv[0]);
        return 2;
    }
    std::ifstream rf(argv[1]);
    if (!rf) {
        fprintf(stderr, "llamacpp_pretokenize: cannot read %s\n", argv[1]);
        return 1;
    }
    const std::vector<std::string> regexes = json::parse(rf).get<std::vector<std::string>>();
    std::ifstream in(argv[2]);
    if (!in) {
        fprintf(stderr, "llamacpp_pretokenize: cannot read %s\n", argv[2]);
        return 1;
    }
    FILE *out = fopen(argv[3], "w");
    if (!out) {
        fprintf(stderr, "llamacpp_pretokenize: cannot write %s\n", argv[3]);
        return 1;
    }
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        json obj = json::parse(line);
        const std::string text = obj.at("text").get<std::string>();
        obj["words"] = unicode_regex_split(text, regexes, false);
        const std::string s = obj.dump(-1, ' ', false, json::error_handler_t::replace);
        fprintf(out, "%s\n", s.c_str());
        n++;
    }
    fclose(out);
    fprintf(stderr, "llamacpp_pretokenize: %d strings split\n", n);
    return 0;
}
