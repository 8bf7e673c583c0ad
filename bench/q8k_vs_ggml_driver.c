/* Driver of bench/q8k_vs_ggml.py: runs ggml's Q8_K activation quantisers (built from the
 * llama.cpp sources of the llama-cpp-python sdist, never vendored) on rows of floats:
 *
 *     q8k_vs_ggml_driver M K IN OUT
 *
 * IN holds M rows of K float32 (M a multiple of 4, K of 256).  OUT gets, one after the other:
 *   quantize_row_q8_K (ggml-cpu/arch/arm/quants.c, what ggml's CPU backend calls as the Q8_K
 *     from_float on Arm) of each row: K/256 block_q8_K (292 bytes each) per row;
 *   ggml_quantize_mat_q8_K_4x4 (ggml-cpu/repack.cpp: the activations of the CPU_REPACK gemm
 *     kernels with 4-byte interleave) of each group of 4 rows: K/256 block_q8_Kx4 (1168 bytes);
 *   ggml_quantize_mat_q8_K_4x8 likewise (8-byte interleave).
 * Output buffers start zeroed (quantize_row_q8_K_ref leaves the sums of an all-zero block as
 * they were). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define Q8K_BYTES 292     /* float d, int8 qs[256], int16 bsums[16] */
#define Q8KX4_BYTES 1168  /* float d[4], int8 qs[1024], int16 bsums[64] */

void quantize_row_q8_K(const float *x, void *y, int64_t k);
void ggml_quantize_mat_q8_K_4x4(const float *x, void *vy, int64_t k);
void ggml_quantize_mat_q8_K_4x8(const float *x, void *vy, int64_t k);

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s M K IN OUT\n", argv[0]);
        return 2;
    }
    long m = atol(argv[1]), k = atol(argv[2]);
    if (m <= 0 || m % 4 || k <= 0 || k % 256) {
        fprintf(stderr, "M must be a positive multiple of 4, K of 256\n");
        return 2;
    }
    size_t nsb = (size_t)k / 256, nx = (size_t)m * (size_t)k;
    float *x = malloc(nx * sizeof(float));
    size_t rows = (size_t)m * nsb * Q8K_BYTES, mats = (size_t)m / 4 * nsb * Q8KX4_BYTES;
    uint8_t *out = calloc(rows + 2 * mats, 1);
    FILE *f = fopen(argv[3], "rb");
    if (!x || !out || !f || fread(x, sizeof(float), nx, f) != nx) {
        fprintf(stderr, "cannot read %s\n", argv[3]);
        return 1;
    }
    fclose(f);
    for (long r = 0; r < m; r++) {
        quantize_row_q8_K(x + r * k, out + (size_t)r * nsb * Q8K_BYTES, k);
    }
    for (long g = 0; g < m / 4; g++) {
        ggml_quantize_mat_q8_K_4x4(x + 4 * g * k, out + rows + (size_t)g * nsb * Q8KX4_BYTES, k);
        ggml_quantize_mat_q8_K_4x8(x + 4 * g * k,
                                   out + rows + mats + (size_t)g * nsb * Q8KX4_BYTES, k);
    }
    f = fopen(argv[4], "wb");
    if (!f || fwrite(out, 1, rows + 2 * mats, f) != rows + 2 * mats) {
        fprintf(stderr, "cannot write %s\n", argv[4]);
        return 1;
    }
    fclose(f);
    return 0;
}
