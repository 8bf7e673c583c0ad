/* Driver of bench/vs_ggml.py: calls one of ggml's K-quant repack kernels (built from the
 * llama.cpp sources, never vendored) on one tile of nb super-blocks of 256 k, on pseudo-random
 * bytes, so that qemu can trace the instructions it runs.  The difference between the traces
 * of nb = 2 and nb = 3 is the kernel's whole path through one super-block.
 *
 *     vs_ggml_driver FUNCTION NB        (FUNCTION: one of the names below)
 *
 * gemm: 4 rows (one block_q8_Kx4) x 8 columns (one block_q4_Kx8 / block_q6_Kx8 group);
 * gemv: 1 row x 8 columns.  Buffers are over-allocated (4 KiB per super-block and operand). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*kernel_fn)(int n, float *s, size_t bs, const void *vx, const void *vy, int nr,
                          int nc);

#define KERNELS(X) \
    X(ggml_gemm_q4_K_8x8_q8_K, 4) X(ggml_gemm_q4_K_8x4_q8_K, 4) \
    X(ggml_gemm_q6_K_8x8_q8_K, 4) X(ggml_gemm_q6_K_8x4_q8_K, 4) \
    X(ggml_gemv_q4_K_8x8_q8_K, 1) X(ggml_gemv_q4_K_8x4_q8_K, 1) \
    X(ggml_gemv_q6_K_8x8_q8_K, 1) X(ggml_gemv_q6_K_8x4_q8_K, 1)

#define DECLARE(name, rows) void name(int, float *, size_t, const void *, const void *, int, int);
KERNELS(DECLARE)

static const struct { const char *name; kernel_fn fn; int rows; } table[] = {
#define ENTRY(name, rows) {#name, name, rows},
    KERNELS(ENTRY)
};

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s FUNCTION NB\n", argv[0]);
        return 2;
    }
    int nb = atoi(argv[2]);
    size_t bytes = (size_t)(nb > 0 ? nb : 1) * 4096;
    uint8_t *x = malloc(bytes), *y = malloc(bytes);
    uint32_t seed = 12345u;
    for (size_t i = 0; i < bytes; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (uint8_t)(seed >> 24);
        seed = seed * 1103515245u + 12345u;
        y[i] = (uint8_t)(seed >> 24);
    }
    float out[4 * 8];
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, argv[1]) == 0) {
            table[i].fn(256 * nb, out, 8, x, y, table[i].rows, 8);
            printf("%g\n", (double)out[0]);
            return 0;
        }
    }
    fprintf(stderr, "unknown function %s\n", argv[1]);
    return 2;
}
