// dump_ops: run one llama.cpp batch and write every graph tensor, in full, to binary files.
//
// Ground truth for op-by-op parity work: Flint's forwards are diffed against these dumps
// layer by layer and position by position (see docs/parity.md and tools/golden/dump_ops.sh).
//
// Usage: dump_ops MODEL.gguf IDS.txt OUTDIR [n_threads]
//   IDS.txt: token ids separated by whitespace (BOS included; nothing is added).
// Writes OUTDIR/<tensor name>.bin (raw f32, row-major: ne0 fastest) for every f32 tensor
// the graph computes, and OUTDIR/index.tsv with name, op, ne0..ne3 per file. Other types
// (f16 cache views, quantized weights) are converted to f32 when ggml can; the index says
// the source type. Also writes OUTDIR/logits.bin [n_tokens x n_vocab].
// DECODE_FROM=n: the first n ids as a generation prefill, then one id per call, dumping
// the last call only (a greedy chain's decode step); N_CTX=c sets the context size.
//
// Built against llama.cpp's static libraries (see dump_ops.sh); the context uses the same
// settings as the golden files: one batch with all tokens, default cache types, default
// flash-attention choice, n_threads threads for both single and batch evaluation.

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

struct dump_state {
    // Whether the call being computed is dumped (DECODE_FROM: only the last one).
    bool on = true;
    std::string dir;
    FILE *index = nullptr;
    std::map<std::string, int> seen;
};

static std::string safe_name(const char *n) {
    std::string s(n);
    for (auto &c : s) {
        if (c == '/' || c == ' ' || c == '(' || c == ')') c = '_';
    }
    return s;
}

static bool cb(struct ggml_tensor *t, bool ask, void *ud) {
    auto *st = (dump_state *)ud;
    if (ask) return true;  // we want every tensor
    if (!st->on) return true;
    const int64_t n = ggml_nelements(t);
    std::vector<float> buf(n);
    std::vector<uint8_t> raw(ggml_nbytes(t));
    ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
    if (!ggml_is_contiguous(t)) {
        // views (e.g. permuted); record only the index line so the reader knows it exists
        fprintf(st->index, "%s\t%s\t%s\t%lld\t%lld\t%lld\t%lld\tnoncontig\n", t->name, ggml_op_desc(t),
                ggml_type_name(t->type), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                (long long)t->ne[3]);
        return true;
    }
    if (t->type == GGML_TYPE_F32) {
        memcpy(buf.data(), raw.data(), n * sizeof(float));
    } else {
        const auto *tr = ggml_get_type_traits(t->type);
        if (!tr->to_float) return true;
        tr->to_float(raw.data(), buf.data(), n);
    }
    std::string base = safe_name(t->name);
    int k = st->seen[base]++;
    if (k > 0) base += "#" + std::to_string(k);
    std::string path = st->dir + "/" + base + ".bin";
    FILE *f = fopen(path.c_str(), "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path.c_str());
        return false;
    }
    fwrite(buf.data(), sizeof(float), n, f);
    fclose(f);
    fprintf(st->index, "%s\t%s\t%s\t%lld\t%lld\t%lld\t%lld\n", base.c_str(), ggml_op_desc(t),
            ggml_type_name(t->type), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
            (long long)t->ne[3]);
    return true;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf IDS.txt OUTDIR [n_threads]\n", argv[0]);
        return 2;
    }
    const int nt = argc > 4 ? atoi(argv[4]) : 2;
    std::vector<llama_token> ids;
    {
        std::ifstream in(argv[2]);
        long v;
        while (in >> v) ids.push_back((llama_token)v);
    }
    if (ids.empty()) {
        fprintf(stderr, "no ids in %s\n", argv[2]);
        return 2;
    }
    dump_state st;
    st.dir = argv[3];
    st.index = fopen((st.dir + "/index.tsv").c_str(), "w");
    if (!st.index) {
        fprintf(stderr, "cannot write into %s\n", argv[3]);
        return 2;
    }

    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    auto cp = llama_context_default_params();
    // The context and the batch hold the whole id list (at least 512, as before).
    uint32_t n_ctx = ids.size() > 512 ? (uint32_t)ids.size() : 512;
    if (const char *c = getenv("N_CTX")) n_ctx = (uint32_t)atoi(c);
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_threads = nt;
    cp.n_threads_batch = nt;
    cp.cb_eval = getenv("DUMP_OFF") ? nullptr : cb;
    cp.cb_eval_user_data = &st;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;

    // DECODE_FROM=n: the first n ids as one batch asking for its last logits (a generation
    // prefill), then the others one token per call, as a greedy chain runs; only the last
    // call is dumped and its logits written. The context then holds the chain's tokens
    // (set N_CTX to the golden's context to reproduce a greedy golden's cache size).
    if (const char *df = getenv("DECODE_FROM")) {
        const size_t n0 = (size_t)atoi(df);
        if (n0 == 0 || n0 >= ids.size()) {
            fprintf(stderr, "DECODE_FROM=%s: needs 1 <= n < %zu ids\n", df, ids.size());
            return 2;
        }
        llama_batch p = llama_batch_init((int)n0, 0, 1);
        for (size_t i = 0; i < n0; i++) {
            p.token[i] = ids[i];
            p.pos[i] = (llama_pos)i;
            p.n_seq_id[i] = 1;
            p.seq_id[i][0] = 0;
            p.logits[i] = i + 1 == n0;
        }
        p.n_tokens = (int)n0;
        st.on = false;
        if (llama_decode(ctx, p) != 0) {
            fprintf(stderr, "decode failed (prompt)\n");
            return 1;
        }
        for (size_t j = n0; j < ids.size(); j++) {
            p.token[0] = ids[j];
            p.pos[0] = (llama_pos)j;
            p.n_seq_id[0] = 1;
            p.seq_id[0][0] = 0;
            p.logits[0] = 1;
            p.n_tokens = 1;
            st.on = j + 1 == ids.size();
            if (llama_decode(ctx, p) != 0) {
                fprintf(stderr, "decode failed at id %zu\n", j);
                return 1;
            }
        }
        const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
        FILE *f = fopen((st.dir + "/logits.bin").c_str(), "wb");
        fwrite(llama_get_logits_ith(ctx, 0), sizeof(float), nv, f);
        fclose(f);
        fclose(st.index);
        llama_batch_free(p);
        llama_free(ctx);
        llama_model_free(model);
        llama_backend_free();
        return 0;
    }

    llama_batch b = llama_batch_init((int)ids.size(), 0, 1);
    for (size_t i = 0; i < ids.size(); i++) {
        b.token[i] = ids[i];
        b.pos[i] = (llama_pos)i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        // LAST_ONLY=1: logits for the last token only, as a generation prefill asks
        // (llama.cpp then computes the last layer after attention for that row alone).
        b.logits[i] = getenv("LAST_ONLY") ? (i + 1 == ids.size()) : 1;
    }
    b.n_tokens = (int)ids.size();
    if (llama_decode(ctx, b) != 0) {
        fprintf(stderr, "decode failed\n");
        return 1;
    }
    const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE *f = fopen((st.dir + "/logits.bin").c_str(), "wb");
    for (size_t i = 0; i < ids.size(); i++) {
        if (b.logits[i]) fwrite(llama_get_logits_ith(ctx, (int)i), sizeof(float), nv, f);
    }
    fclose(f);
    fclose(st.index);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
