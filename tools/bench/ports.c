/*
 * ports: how many of each 512-bit instruction the decode kernels use this CPU retires a
 * cycle, alone and in pairs, to tell which execution ports it shares (a kernel bound by
 * one port gains nothing from moving work between two instructions that both use it).
 *
 * Each test runs twelve independent chains of one instruction (or of two, alternating)
 * from registers, 24 instructions a loop pass; the core clock comes from a dependent
 * chain of `vpaddd` (one cycle each), so the figures are in core cycles whatever the TSC
 * rate. An instruction two ports can take reads about 0.5 cycles, one port about 1.0; a
 * pair of one-port instructions reads 0.5 if they use different ports and 1.0 if they
 * share one.
 *
 * Build and run:  cc -O2 -march=native tools/bench/ports.c -o /tmp/ports && /tmp/ports
 * Needs AVX-512 F/BW/VNNI/VBMI and GFNI (docs/benchmarks.md, the low-bit section, quotes
 * it on the Emerald Rapids host).
 */
#include <stdint.h>
#include <stdio.h>
#include <x86intrin.h>

#define ITERS 20000000L

/* Twelve copies of an instruction template `M(n)` on registers zmm0..zmm11; zmm30 and
 * zmm31 are the second and third operands. */
#define REP12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#define ALT12(A, B) A(0) B(1) A(2) B(3) A(4) B(5) A(6) B(7) A(8) B(9) A(10) B(11)
#define CLOBBERS                                                                           \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",       \
        "xmm10", "xmm11", "xmm30", "xmm31"

#define ADDD(n) "vpaddd %%zmm30, %%zmm" #n ", %%zmm" #n "\n\t"
#define SUBW(n) "vpsubw %%zmm30, %%zmm" #n ", %%zmm" #n "\n\t"
#define TERN(n) "vpternlogd $0xE4, %%zmm30, %%zmm31, %%zmm" #n "\n\t"
#define MADDUBS(n) "vpmaddubsw %%zmm30, %%zmm" #n ", %%zmm" #n "\n\t"
#define DPWSSDS(n) "vpdpwssds %%zmm30, %%zmm31, %%zmm" #n "\n\t"
#define DPBUSD(n) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #n "\n\t"
#define GF(n) "vgf2p8affineqb $0, %%zmm30, %%zmm" #n ", %%zmm" #n "\n\t"
#define SRLW(n) "vpsrlw $2, %%zmm" #n ", %%zmm" #n "\n\t"
#define SRLVD(n) "vpsrlvd %%zmm30, %%zmm" #n ", %%zmm" #n "\n\t"
#define PERMB(n) "vpermb %%zmm" #n ", %%zmm30, %%zmm" #n "\n\t"
#define SHUFB(n) "vpshufb %%zmm30, %%zmm" #n ", %%zmm" #n "\n\t"
#define PERMT2D(n) "vpermt2d %%zmm30, %%zmm31, %%zmm" #n "\n\t"
#define CVTDQ2PS(n) "vcvtdq2ps %%zmm" #n ", %%zmm" #n "\n\t"
#define FMA(n) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #n "\n\t"
#define CVTPH2PS(n) "vcvtph2ps %%ymm30, %%zmm" #n "\n\t"

/* Seconds-free timing: TSC ticks per pass of 24 instructions. */
#define TIME(body)                                                                         \
    ({                                                                                     \
        uint64_t t0 = __rdtsc();                                                           \
        for (long i = 0; i < ITERS; i++) __asm__ volatile(body body::: CLOBBERS);          \
        (double)(__rdtsc() - t0) / ITERS / 24.0;                                           \
    })

int main(void) {
    /* The clock: 24 dependent one-cycle adds a pass. */
    double tick = TIME(ADDD(0) ADDD(0) ADDD(0) ADDD(0) ADDD(0) ADDD(0) ADDD(0) ADDD(0)
                           ADDD(0) ADDD(0) ADDD(0) ADDD(0));
    printf("TSC ticks per core cycle: %.3f\n", tick);
    printf("%-28s %s\n", "instruction(s)", "core cycles per instruction");
#define ROW(name, body) printf("%-28s %.2f\n", name, TIME(body) / tick)
    ROW("vpaddd", REP12(ADDD));
    ROW("vpsubw", REP12(SUBW));
    ROW("vpternlogd", REP12(TERN));
    ROW("vpmaddubsw", REP12(MADDUBS));
    ROW("vpdpwssds", REP12(DPWSSDS));
    ROW("vpdpbusd", REP12(DPBUSD));
    ROW("vcvtdq2ps", REP12(CVTDQ2PS));
    ROW("vfmadd231ps", REP12(FMA));
    ROW("vgf2p8affineqb", REP12(GF));
    ROW("vpsrlw (imm)", REP12(SRLW));
    ROW("vpsrlvd", REP12(SRLVD));
    ROW("vpermb", REP12(PERMB));
    ROW("vpshufb", REP12(SHUFB));
    ROW("vpermt2d", REP12(PERMT2D));
    ROW("vcvtph2ps", REP12(CVTPH2PS));
    ROW("vgf2p8affineqb + vpsrlw", ALT12(GF, SRLW));
    ROW("vgf2p8affineqb + vpshufb", ALT12(GF, SHUFB));
    ROW("vpsrlw + vpshufb", ALT12(SRLW, SHUFB));
    ROW("vpermb + vpshufb", ALT12(PERMB, SHUFB));
    ROW("vgf2p8affineqb + vpmaddubsw", ALT12(GF, MADDUBS));
    return 0;
}
