// llamacpp_tokenize: llama.cpp's token ids (and detokenized text) for many strings at once.
//
// Usage: llamacpp_tokenize VOCAB.gguf IN.jsonl OUT.jsonl [--parse-special] [--add-special]
//   IN.jsonl: one JSON object per line with a "text" string.
//   OUT.jsonl: the same lines with "ids" (llama_tokenize with the given add_special /
//   parse_special, both off by default: no BOS, special-token text tokenized as text) and
//   "detok" (llama_detokenize of those ids, remove_special off, unparse_special equal to
//   parse_special; bytes that are not UTF-8 become U+FFFD).
// The vocabulary is loaded alone (vocab_only), as llama-tokenize and test-tokenizer-0 do,
// so vocab-only GGUFs such as llama.cpp/models/ggml-vocab-*.gguf work. One process for all
// strings: tools/golden/tokenize_strings.py runs it. Built by llamacpp_run.sh.

#include "llama.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

using json = nlohmann::ordered_json;

static void quiet_log(ggml_log_level level, const char *text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s VOCAB.gguf IN.jsonl OUT.jsonl [--parse-special] [--add-special]\n", argv[0]);
        return 2;
    }
    bool parse_special = false, add_special = false;
    for (int i = 4; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--parse-special") parse_special = true;
        else if (a == "--add-special") add_special = true;
        else {
            fprintf(stderr, "llamacpp_tokenize: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llamacpp_tokenize: cannot load vocabulary %s\n", argv[1]);
        return 1;
    }
    const llama_vocab *vocab = llama_model_get_vocab(model);
    std::ifstream in(argv[2]);
    if (!in) {
        fprintf(stderr, "llamacpp_tokenize: cannot read %s\n", argv[2]);
        return 1;
    }
    FILE *out = fopen(argv[3], "w");
    if (!out) {
        fprintf(stderr, "llamacpp_tokenize: cannot write %s\n", argv[3]);
        return 1;
    }
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        json obj = json::parse(line);
        const std::string text = obj.at("text").get<std::string>();
        std::vector<llama_token> ids(text.size() + 8);
        int k = llama_tokenize(vocab, text.data(), (int)text.size(), ids.data(), (int)ids.size(), add_special,
                               parse_special);
        if (k < 0) {
            ids.resize(-k);
            k = llama_tokenize(vocab, text.data(), (int)text.size(), ids.data(), (int)ids.size(), add_special,
                               parse_special);
        }
        if (k < 0) {
            fprintf(stderr, "llamacpp_tokenize: llama_tokenize failed on line %d\n", n + 1);
            return 1;
        }
        ids.resize(k);
        std::vector<char> buf(text.size() * 4 + 64);
        int m = llama_detokenize(vocab, ids.data(), k, buf.data(), (int)buf.size(), false, parse_special);
        if (m < 0) {
            buf.resize(-m);
            m = llama_detokenize(vocab, ids.data(), k, buf.data(), (int)buf.size(), false, parse_special);
        }
        obj["ids"] = ids;
        obj["detok"] = std::string(buf.data(), m < 0 ? 0 : m);
        const std::string s = obj.dump(-1, ' ', false, json::error_handler_t::replace);
        fprintf(out, "%s\n", s.c_str());
        n++;
    }
    fclose(out);
    llama_model_free(model);
    llama_backend_free();
    fprintf(stderr, "llamacpp_tokenize: %d strings tokenized with %s\n", n, argv[1]);
    return 0;
}
