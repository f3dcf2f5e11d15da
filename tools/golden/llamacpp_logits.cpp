// llamacpp_logits: llama.cpp's logits for a token sequence, as golden files.
//
// The oracle side of Flint's model comparisons (tools/golden/README.md). Two modes:
//
//   llamacpp_logits MODEL.gguf logits IDS OUT.json [--start S] [--stride K] [--top N]
//                   [--chunk C] [--threads T]
//     Teacher-forced: every token of IDS (a file of whitespace-separated ids, or a JSON
//     object with an "ids" array; BOS included, nothing added) goes through the model; for each position the log-sum-exp of all
//     logits and the N (default 20) best [id, logit] predicting the next token. The format
//     of shared/golden/gemma3-270m/logits-top20.json:
//       {"ids":[...],"positions":[{"lse":L,"top":[[id,logit],...]},...]}
//     With --start / --stride only positions start, start+stride, ... are written: the
//     object then also has "start" and "stride", and every position its index "pos".
//     The sequence is decoded in chunks of C tokens (default: all of it), each chunk one
//     batch with n_batch = n_ubatch = C, so one graph computes it. The batch size picks
//     llama.cpp's kernels (small batches take other matmul paths), so logits depend on C
//     beyond rounding: goldens use the default, one batch.
//
//   llamacpp_logits MODEL.gguf greedy PROMPTS.txt OUT.jsonl [--steps N] [--top K] [--threads T]
//     Greedy chains: one prompt per line of PROMPTS.txt (ids, BOS included). The prompt is
//     decoded as one batch (logits for its last token only), then one token per step, up
//     to N (default 32) steps or an end-of-generation token (which is written, then the
//     chain stops). One line per prompt, in the format of shared/golden/gemma3-270m/greedy.jsonl:
//       {"prompt":TEXT,"prompt_ids":[...],"steps":[{"id":I,"piece":P,"margin":M,
//        "top":[[id,logit],...],"lse":L},...]}
//     TEXT is the prompt detokenized without its BOS; margin is top-1 minus top-2 logit.
//
// Context: llama.cpp's defaults (cache types, flash-attention choice, unified cache) with
// n_ctx the tokens the run needs, CPU only, T threads (default 2) for single-token and
// batch evaluation alike. Numbers are printed with 6 decimals, lse computed in double.
// Built against llama.cpp's static libraries by llamacpp_run.sh.

#include "llama.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string &msg) {
    fprintf(stderr, "llamacpp_logits: error: %s\n", msg.c_str());
    exit(1);
}

std::vector<llama_token> parse_ids(const std::string &line, const std::string &file) {
    std::vector<llama_token> ids;
    std::istringstream in(line);
    std::string tok;
    while (in >> tok) {
        char *end = nullptr;
        long v = strtol(tok.c_str(), &end, 10);
        if (*end != '\0' || v < 0 || v > INT32_MAX) die(file + ": '" + tok + "' is not a token id");
        ids.push_back((llama_token)v);
    }
    return ids;
}

std::string json_str(const std::string &s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += (char)c;  // UTF-8 passes through (invalid bytes too; see piece())
                }
        }
    }
    return out + "\"";
}

std::string fmt6(double x) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.6f", x);
    return buf;
}

std::string ids_json(const std::vector<llama_token> &ids) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); i++) {
        if (i) s += ",";
        s += std::to_string(ids[i]);
    }
    return s + "]";
}

struct Row {
    double lse;
    std::vector<std::pair<llama_token, float>> top;  // best first; ties: lower id first
};

Row summarize(const float *logits, int n_vocab, int k) {
    Row r;
    double mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++) mx = std::max(mx, (double)logits[i]);
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += std::exp((double)logits[i] - mx);
    r.lse = mx + std::log(sum);
    std::vector<int> idx(n_vocab);
    std::iota(idx.begin(), idx.end(), 0);
    k = std::min(k, n_vocab);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < k; i++) r.top.emplace_back(idx[i], logits[idx[i]]);
    return r;
}

std::string top_json(const Row &r) {
    std::string s = "[";
    for (size_t i = 0; i < r.top.size(); i++) {
        if (i) s += ",";
        s += "[" + std::to_string(r.top[i].first) + "," + fmt6(r.top[i].second) + "]";
    }
    return s + "]";
}

// Invalid UTF-8 (a piece holding part of a character) is written as U+FFFD per byte so the
// output stays valid JSON text; ids, not pieces, are what tests compare.
std::string sanitize_utf8(const std::string &s) {
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = s[i];
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= s.size();
        for (int j = 1; ok && j < n; j++) ok = ((unsigned char)s[i + j] >> 6) == 2;
        if (ok) {
            out.append(s, i, n);
            i += n;
        } else {
            out += "\xEF\xBF\xBD";
            i += 1;
        }
    }
    return out;
}

std::string piece(const llama_vocab *vocab, llama_token id) {
    std::vector<char> buf(256);
    int n = llama_token_to_piece(vocab, id, buf.data(), (int)buf.size(), 0, true);
    if (n < 0) {
        buf.resize(-n);
        n = llama_token_to_piece(vocab, id, buf.data(), (int)buf.size(), 0, true);
    }
    return sanitize_utf8(std::string(buf.data(), std::max(n, 0)));
}

std::string detokenize(const llama_vocab *vocab, const std::vector<llama_token> &ids) {
    std::vector<char> buf(ids.size() * 16 + 64);
    int n = llama_detokenize(vocab, ids.data(), (int)ids.size(), buf.data(), (int)buf.size(), true, false);
    if (n < 0) {
        buf.resize(-n);
        n = llama_detokenize(vocab, ids.data(), (int)ids.size(), buf.data(), (int)buf.size(), true, false);
    }
    return sanitize_utf8(std::string(buf.data(), std::max(n, 0)));
}

struct Opts {
    int start = 0, stride = 1, top = -1, chunk = 0, threads = 2, steps = 32;
};

llama_context *make_context(llama_model *model, int n_ctx, int n_batch, int threads) {
    auto cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = (uint32_t)n_batch;
    cp.n_ubatch = (uint32_t)n_batch;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("llama_init_from_model failed");
    return ctx;
}

void check_ids(const std::vector<llama_token> &ids, int n_vocab, const std::string &file) {
    for (llama_token t : ids) {
        if (t >= n_vocab) die(file + ": id " + std::to_string(t) + " >= n_vocab " + std::to_string(n_vocab));
    }
}

int run_logits(llama_model *model, const std::string &in, const std::string &out, const Opts &o) {
    std::ifstream f(in);
    if (!f) die("cannot read " + in);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    std::vector<llama_token> ids;
    if (text.find_first_not_of(" \t\r\n") != std::string::npos && text[text.find_first_not_of(" \t\r\n")] == '{') {
        try {
            const nlohmann::json doc = nlohmann::json::parse(text);
            for (const auto &v : doc.at("ids")) ids.push_back(v.get<llama_token>());
        } catch (const std::exception &e) {
            die(in + ": no \"ids\" array of token ids (" + e.what() + ")");
        }
    } else {
        for (auto &c : text) {
            if (c == '\n' || c == '\r') c = ' ';
        }
        ids = parse_ids(text, in);
    }
    if (ids.empty()) die(in + " holds no token ids");
    const llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    check_ids(ids, n_vocab, in);
    const int n = (int)ids.size();
    const int chunk = o.chunk > 0 ? std::min(o.chunk, n) : n;
    const int top = o.top > 0 ? o.top : 20;
    const bool subset = o.start != 0 || o.stride != 1;
    auto wanted = [&](int i) { return i >= o.start && (i - o.start) % o.stride == 0; };

    llama_context *ctx = make_context(model, n, chunk, o.threads);
    std::vector<Row> rows;
    std::vector<int> pos_of;
    for (int c0 = 0; c0 < n; c0 += chunk) {
        const int m = std::min(chunk, n - c0);
        llama_batch b = llama_batch_init(m, 0, 1);
        for (int i = 0; i < m; i++) {
            b.token[i] = ids[c0 + i];
            b.pos[i] = c0 + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = wanted(c0 + i);
        }
        b.n_tokens = m;
        if (llama_decode(ctx, b) != 0) die("llama_decode failed at chunk starting at " + std::to_string(c0));
        for (int i = 0; i < m; i++) {
            if (!b.logits[i]) continue;
            rows.push_back(summarize(llama_get_logits_ith(ctx, i), n_vocab, top));
            pos_of.push_back(c0 + i);
        }
        llama_batch_free(b);
    }
    llama_free(ctx);

    FILE *fo = fopen(out.c_str(), "w");
    if (!fo) die("cannot write " + out);
    std::string s = "{\"ids\":" + ids_json(ids);
    if (subset) s += ",\"start\":" + std::to_string(o.start) + ",\"stride\":" + std::to_string(o.stride);
    s += ",\"positions\":[";
    for (size_t i = 0; i < rows.size(); i++) {
        if (i) s += ",";
        s += "{";
        if (subset) s += "\"pos\":" + std::to_string(pos_of[i]) + ",";
        s += "\"lse\":" + fmt6(rows[i].lse) + ",\"top\":" + top_json(rows[i]) + "}";
    }
    s += "]}\n";
    fputs(s.c_str(), fo);
    fclose(fo);
    fprintf(stderr, "llamacpp_logits: %d tokens, %zu positions written to %s\n", n, rows.size(), out.c_str());
    return 0;
}

int run_greedy(llama_model *model, const std::string &in, const std::string &out, const Opts &o) {
    std::ifstream f(in);
    if (!f) die("cannot read " + in);
    std::vector<std::vector<llama_token>> prompts;
    std::string line;
    while (std::getline(f, line)) {
        auto ids = parse_ids(line, in);
        if (!ids.empty()) prompts.push_back(ids);
    }
    if (prompts.empty()) die(in + " holds no prompts");
    const llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const int top = o.top > 0 ? o.top : 5;
    size_t longest = 0;
    for (auto &p : prompts) {
        check_ids(p, n_vocab, in);
        longest = std::max(longest, p.size());
    }
    llama_context *ctx = make_context(model, (int)longest + o.steps, (int)longest, o.threads);
    FILE *fo = fopen(out.c_str(), "w");
    if (!fo) die("cannot write " + out);
    for (auto &p : prompts) {
        llama_memory_clear(llama_get_memory(ctx), true);
        std::vector<llama_token> text_ids = p;
        if (!text_ids.empty() && text_ids[0] == llama_vocab_bos(vocab)) text_ids.erase(text_ids.begin());
        std::string s = "{\"prompt\":" + json_str(detokenize(vocab, text_ids)) + ",\"prompt_ids\":" + ids_json(p) +
                        ",\"steps\":[";
        llama_batch b = llama_batch_init((int)p.size(), 0, 1);
        for (size_t i = 0; i < p.size(); i++) {
            b.token[i] = p[i];
            b.pos[i] = (llama_pos)i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = i + 1 == p.size();
        }
        b.n_tokens = (int)p.size();
        int pos = (int)p.size();
        for (int step = 0; step < o.steps; step++) {
            if (llama_decode(ctx, b) != 0) die("llama_decode failed at step " + std::to_string(step));
            const Row r = summarize(llama_get_logits_ith(ctx, b.n_tokens - 1), n_vocab, std::max(top, 2));
            const llama_token next = r.top[0].first;
            Row shown = r;
            shown.top.resize(std::min<size_t>(shown.top.size(), (size_t)top));
            if (step) s += ",";
            s += "{\"id\":" + std::to_string(next) + ",\"piece\":" + json_str(piece(vocab, next)) +
                 ",\"margin\":" + fmt6((double)r.top[0].second - (double)r.top[1].second) +
                 ",\"top\":" + top_json(shown) + ",\"lse\":" + fmt6(r.lse) + "}";
            if (llama_vocab_is_eog(vocab, next)) break;
            b.token[0] = next;
            b.pos[0] = pos++;
            b.n_seq_id[0] = 1;
            b.seq_id[0][0] = 0;
            b.logits[0] = 1;
            b.n_tokens = 1;
        }
        llama_batch_free(b);
        s += "]}\n";
        fputs(s.c_str(), fo);
    }
    fclose(fo);
    llama_free(ctx);
    fprintf(stderr, "llamacpp_logits: %zu greedy chains written to %s\n", prompts.size(), out.c_str());
    return 0;
}

int int_arg(int argc, char **argv, int &i, const char *name) {
    if (i + 1 >= argc) die(std::string(name) + " needs a value");
    char *end = nullptr;
    long v = strtol(argv[++i], &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX) die(std::string(name) + ": '" + argv[i] + "' is not a count");
    return (int)v;
}

void quiet_log(ggml_log_level level, const char *text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr,
                "usage: %s MODEL.gguf logits IDS.txt OUT.json [--start S] [--stride K] [--top N] [--chunk C] "
                "[--threads T]\n"
                "       %s MODEL.gguf greedy PROMPTS.txt OUT.jsonl [--steps N] [--top K] [--threads T]\n",
                argv[0], argv[0]);
        return 2;
    }
    const std::string mode = argv[2];
    Opts o;
    for (int i = 5; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--start") o.start = int_arg(argc, argv, i, "--start");
        else if (a == "--stride") o.stride = int_arg(argc, argv, i, "--stride");
        else if (a == "--top") o.top = int_arg(argc, argv, i, "--top");
        else if (a == "--chunk") o.chunk = int_arg(argc, argv, i, "--chunk");
        else if (a == "--threads") o.threads = int_arg(argc, argv, i, "--threads");
        else if (a == "--steps") o.steps = int_arg(argc, argv, i, "--steps");
        else die("unknown option " + a);
    }
    if (o.stride < 1) die("--stride must be at least 1");
    if (o.threads < 1) die("--threads must be at least 1");
    if (mode != "logits" && mode != "greedy") die("mode must be 'logits' or 'greedy', not '" + mode + "'");

    if (!getenv("LLAMACPP_LOGITS_VERBOSE")) llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) die(std::string("cannot load model ") + argv[1]);
    const int rc = mode == "logits" ? run_logits(model, argv[3], argv[4], o) : run_greedy(model, argv[3], argv[4], o);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
