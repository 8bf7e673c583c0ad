/* Driver of bench/vs_ggml.py: calls one of ggml's K-quant repack kernels (built from the
 * llama.cpp sources, never vendored) on one tile of nb super-blocks of 256 k, on pseudo-random
 * bytes, so that qemu can trace the instructions it runs.  The difference between the traces
 * of nb = 2 and nb = 3 is the kernel's whole path through one super-block.
 *
 *     vs_ggml_driver FUNCTION NB        (FUNCTION: one of the names below)
 *
 * gemm: 4 rows (one block_q8_Kx4 / block_q8_0x4) x the kernel's column group (8: one
 * block_<type>x8 of a K-quant type; 4: block_iq4_nlx4, whose 256 k are 8 blocks of 32); gemv:
 * 1 row.  Buffers are over-allocated (16 KiB per super-block and operand).
 *
 * ggml's vec_dot functions (VEC_DOTS(X): X(name, nrc), e.g. ggml_vec_dot_iq4_xs_q8_K of
 * arch/arm/quants.c, what ggml's mul_mat calls for a type without a repack) are called the way
 * mul_mat calls them: n = 256 nb, one output (nrc = 1), or nrc x nrc outputs (nrc rows of
 * weights bx bytes apart, nrc columns of activations by bytes apart, results bs = 16 floats
 * apart), on the same pseudo-random bytes.
 *
 * Built with -DTILEGEN_KERNEL=<name> -DTILE_MR=<mr> -DTILE_NR=<nr> it calls that generated
 * tilegen kernel instead (the Q8 calling convention of tilegen.callconv: m, n, k, packed LHS,
 * packed RHS, dst, dst row / column strides in bytes, clamp bounds) on one mr x nr tile: the
 * same trace cross-checks tilegen.analysis.mca.per_k. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*kernel_fn)(int n, float *s, size_t bs, const void *vx, const void *vy, int nr,
                          int nc);
typedef void (*vec_dot_fn)(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy,
                           size_t by, int nrc);

/* KERNELS(X): X(name, rows, cols) of every ggml kernel the bench measures, given on the command
 * line by bench/vs_ggml.py (-D'KERNELS(X)=X(ggml_gemm_q4_K_8x8_q8_K,4,8) ...', from the
 * registry's families) */
#ifndef KERNELS
#error "build with -D'KERNELS(X)=X(name,rows,cols) ...' (bench/vs_ggml.py does)"
#endif
/* VEC_DOTS(X): X(name, nrc) of every ggml vec_dot function measured (none by default) */
#ifndef VEC_DOTS
#define VEC_DOTS(X)
#endif

#ifdef TILEGEN_KERNEL
void TILEGEN_KERNEL(size_t m, size_t n, size_t k, const void *lhs, const void *rhs, float *dst,
                    size_t dst_stride_row, size_t dst_stride_col, float lo, float hi);
#else
#define DECLARE(name, rows, cols) void name(int, float *, size_t, const void *, const void *, int, int);
KERNELS(DECLARE)


static const struct { const char *name; kernel_fn fn; int rows, cols; } table[] = {
#define ENTRY(name, rows, cols) {#name, name, rows, cols},
    KERNELS(ENTRY)
    {0, 0, 0, 0}
};

#define DECLARE_DOT(name, nrc) void name(int, float *, size_t, const void *, size_t, const void *, \
                                         size_t, int);
VEC_DOTS(DECLARE_DOT)

static const struct { const char *name; vec_dot_fn fn; int nrc; } dots[] = {
#define DOT_ENTRY(name, nrc) {#name, name, nrc},
    VEC_DOTS(DOT_ENTRY)
    {0, 0, 0}
};
#endif

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s FUNCTION NB\n", argv[0]);
        return 2;
    }
    int nb = atoi(argv[2]);
    size_t bytes = (size_t)(nb > 0 ? nb : 1) * 16384;
    uint8_t *x = malloc(bytes), *y = malloc(bytes);
    uint32_t seed = 12345u;
    for (size_t i = 0; i < bytes; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (uint8_t)(seed >> 24);
        seed = seed * 1103515245u + 12345u;
        y[i] = (uint8_t)(seed >> 24);
    }
#ifdef TILEGEN_KERNEL
    static float tile[TILE_MR * TILE_NR];
    TILEGEN_KERNEL(TILE_MR, TILE_NR, 256 * (size_t)nb, y, x, tile, TILE_NR * sizeof(float),
                   sizeof(float), -3e38f, 3e38f);
    printf("%g\n", (double)tile[0]);
    return 0;
#else
    float out[4 * 8];
    /* nrc rows (columns) of nb super-blocks each: half the buffer apart */
    size_t half = bytes / 2;
    for (size_t i = 0; dots[i].name; i++) {
        if (strcmp(dots[i].name, argv[1]) == 0) {
            dots[i].fn(256 * nb, out, 16, x, half, y, half, dots[i].nrc);
            printf("%g\n", (double)out[0]);
            return 0;
        }
    }
    for (size_t i = 0; table[i].name; i++) {
        if (strcmp(table[i].name, argv[1]) == 0) {
            table[i].fn(256 * nb, out, 8, x, y, table[i].rows, table[i].cols);
            printf("%g\n", (double)out[0]);
            return 0;
        }
    }
    fprintf(stderr, "unknown function %s\n", argv[1]);
    return 2;
#endif
}
