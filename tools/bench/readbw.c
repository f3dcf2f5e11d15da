/*
 * readbw: memory read bandwidth with N threads, the denominator of the decode roofline
 * (issue 10). Each thread first writes its own slice (so its pages are local to it), then
 * every pass all threads read their slices between two barriers, in two patterns timed
 * apart (which goes first alternates by pass): one stream summed as 64-bit words, and
 * four streams side by side with a software prefetch 1 KiB ahead of each (the access
 * pattern of Flint's four-row decode kernels). A pattern's bandwidth is the buffer size
 * over the wall time from the first barrier to the last. The buffer starts on a 2 MiB
 * boundary and is advised for transparent huge pages, as Flint's weights are: on hosts
 * where huge pages are granted only on request (`madvise` in
 * /sys/kernel/mm/transparent_hugepage/enabled), small pages make the read loop the slower
 * reader.
 *
 * usage: readbw [BYTES [THREADS [PASSES]]]   (defaults: 2 GiB, 2 threads, 7 passes)
 * prints one JSON object: bytes, threads, passes, median_gb_s (the faster pattern's
 * median: the roofline), best_gb_s, plain_median_gb_s, streams_median_gb_s
 * (GB = 1e9 bytes).
 *
 * Build: cc -O3 -march=native -pthread readbw.c -o readbw   (compare.sh does this)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct {
    const uint64_t *base;
    size_t words;
    int passes;
    pthread_barrier_t *barrier;
    double *pass_start; /* [2 * passes]: pattern k of pass p at 2p + k */
    double *pass_end;
    int id;
    uint64_t sink;
} worker_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Eight independent accumulators so the compiler can keep several vector loads in flight. */
static uint64_t sum_words(const uint64_t *p, size_t n) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 += p[i + 0];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
        a4 += p[i + 4];
        a5 += p[i + 5];
        a6 += p[i + 6];
        a7 += p[i + 7];
    }
    for (; i < n; i++) a0 += p[i];
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

/* Four streams side by side (a quarter of the slice apart), each prefetched 1 KiB ahead. */
static uint64_t sum_streams(const uint64_t *p, size_t n) {
    size_t q = n / 4;
    q -= q % 8;
    uint64_t a[4][8] = {{0}};
    for (size_t i = 0; i + 8 <= q; i += 8) {
        for (int s = 0; s < 4; s++) {
            const uint64_t *ps = p + (size_t)s * q + i;
            __builtin_prefetch((const char *)ps + 1024);
            for (int k = 0; k < 8; k++) a[s][k] += ps[k];
        }
    }
    uint64_t t = sum_words(p + 4 * q, n - 4 * q);
    for (int s = 0; s < 4; s++)
        for (int k = 0; k < 8; k++) t += a[s][k];
    return t;
}

static void *work(void *arg) {
    worker_t *w = (worker_t *)arg;
    /* First touch by the reading thread. */
    memset((void *)w->base, 1 + w->id, w->words * sizeof(uint64_t));
    for (int p = 0; p < w->passes; p++) {
        for (int j = 0; j < 2; j++) {
            int k = (p + j) % 2; /* 0: one stream, 1: four streams */
            pthread_barrier_wait(w->barrier);
            if (w->id == 0) w->pass_start[2 * p + k] = now_s();
            w->sink += k ? sum_streams(w->base, w->words) : sum_words(w->base, w->words);
            pthread_barrier_wait(w->barrier);
            if (w->id == 0) w->pass_end[2 * p + k] = now_s();
        }
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long parse_pos(const char *s, const char *what) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v <= 0) {
        fprintf(stderr, "readbw: %s must be a positive integer, got '%s'\n", what, s);
        exit(2);
    }
    return (long)v;
}

int main(int argc, char **argv) {
    size_t bytes = (size_t)2 << 30;
    int threads = 2, passes = 7;
    if (argc > 1) bytes = (size_t)parse_pos(argv[1], "BYTES");
    if (argc > 2) threads = (int)parse_pos(argv[2], "THREADS");
    if (argc > 3) passes = (int)parse_pos(argv[3], "PASSES");
    if (argc > 4) {
        fprintf(stderr, "usage: readbw [BYTES [THREADS [PASSES]]]\n");
        return 2;
    }

    size_t words_per_thread = bytes / sizeof(uint64_t) / (size_t)threads;
    words_per_thread -= words_per_thread % 8; /* 64-byte slices */
    size_t total_bytes = words_per_thread * sizeof(uint64_t) * (size_t)threads;
    if (words_per_thread == 0) {
        fprintf(stderr, "readbw: BYTES too small for %d threads\n", threads);
        return 2;
    }
    const size_t huge = (size_t)2 << 20;
    size_t alloc_bytes = (total_bytes + huge - 1) / huge * huge;
    uint64_t *buf = aligned_alloc(huge, alloc_bytes);
    if (!buf) {
        fprintf(stderr, "readbw: cannot allocate %zu bytes\n", total_bytes);
        return 1;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(buf, alloc_bytes, MADV_HUGEPAGE); /* advice only */
#endif

    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    double *t0 = calloc(2 * (size_t)passes, sizeof(double));
    double *t1 = calloc(2 * (size_t)passes, sizeof(double));
    worker_t *ws = calloc((size_t)threads, sizeof(worker_t));
    pthread_t *tids = calloc((size_t)threads, sizeof(pthread_t));
    if (!t0 || !t1 || !ws || !tids) {
        fprintf(stderr, "readbw: out of memory\n");
        return 1;
    }
    for (int i = 0; i < threads; i++) {
        ws[i] = (worker_t){buf + (size_t)i * words_per_thread, words_per_thread, passes, &barrier,
                           t0, t1, i, 0};
        if (pthread_create(&tids[i], NULL, work, &ws[i]) != 0) {
            fprintf(stderr, "readbw: pthread_create failed\n");
            return 1;
        }
    }
    uint64_t sink = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tids[i], NULL);
        sink += ws[i].sink;
    }

    double *gbs = calloc(2 * (size_t)passes, sizeof(double));
    if (!gbs) return 1;
    double med[2], best = 0;
    for (int k = 0; k < 2; k++) {
        double *g = gbs + (size_t)k * passes;
        for (int p = 0; p < passes; p++) {
            g[p] = (double)total_bytes / (t1[2 * p + k] - t0[2 * p + k]) / 1e9;
            if (g[p] > best) best = g[p];
        }
        qsort(g, (size_t)passes, sizeof(double), cmp_double);
        med[k] = (passes % 2) ? g[passes / 2] : 0.5 * (g[passes / 2 - 1] + g[passes / 2]);
    }
    printf("{\"bytes\": %zu, \"threads\": %d, \"passes\": %d, \"median_gb_s\": %.2f, "
           "\"best_gb_s\": %.2f, \"plain_median_gb_s\": %.2f, \"streams_median_gb_s\": %.2f, "
           "\"checksum\": %llu}\n",
           total_bytes, threads, passes, med[0] > med[1] ? med[0] : med[1], best, med[0], med[1],
           (unsigned long long)sink);
    free(gbs);
    free(tids);
    free(ws);
    free(t1);
    free(t0);
    free(buf);
    return 0;
}
