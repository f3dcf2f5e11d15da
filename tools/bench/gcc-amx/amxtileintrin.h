/* Put first on the include path of llama.cpp's AMX build (tools/bench/build_llamacpp.sh,
 * FLINT_LLAMACPP_SIMD=amx). GCC's own <amxtileintrin.h> (12 here) declares
 * `_tile_loadconfig(p)` as an asm whose memory operand is `*(const void **)p`: the
 * compiler then believes only the first 8 bytes of the 64-byte tile configuration are
 * read, drops the stores of the tile shapes (rows, colsb) before it, and the first tile
 * load faults with SIGILL (tiles not configured). ggml-cpu/amx/mmq.cpp builds its
 * configuration on the stack and hits this. Here the same instructions take the whole
 * 64-byte configuration as their operand. */
#include_next <amxtileintrin.h>

#if defined(__GNUC__) && !defined(__clang__)
#undef _tile_loadconfig
#undef _tile_storeconfig
#define _tile_loadconfig(p) \
    __asm__ volatile("ldtilecfg\t%X0" ::"m"(*(const unsigned char(*)[64])(p)))
#define _tile_storeconfig(p) \
    __asm__ volatile("sttilecfg\t%X0" : "=m"(*(unsigned char(*)[64])(p)))
#endif
