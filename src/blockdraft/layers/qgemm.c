/* Weight-only 4- and 8-bit matmuls with 8-bit activations, for the CPU (compiled at first use by
 * layers/qgemm.py; no PyTorch headers, called through ctypes).
 *
 * Numerics (the GGUF block formats, as llama.cpp's CPU path multiplies them):
 *   weights, per output column and group of 32 inputs:  q4: w = d*q + m, q in 0..15   (Q4_1)
 *                                                       q8: w = d*q,     q in -127..127 (Q8_0)
 *   activations, per row and group of 32:               x = dx*qx, qx in -127..127, dx = max|x|/127
 *   y[row, col] = sum over groups, in order, of  fma(float(sum_k q*qx), d*dx, acc)  (q4: then
 *                 fma(m, dx*sum_k qx, acc)), rounded once to bf16 at the end.
 * The inner sums are integers (exact), and every row runs the same float operations in the same
 * order whatever the row count, the thread count or the instruction set (AVX512-VNNI, AVX2 and
 * the portable path give the same bits): a verify over k+1 rows rounds each row exactly as a
 * one-row decoding step does.
 *
 * Weight layout, per block of 16 output columns and per group (written by layers/qgemm.py):
 *   q4: 4 x 64 bytes; in the t-th 64 bytes, column c's 4 bytes hold q[c, 8t+b] | q[c, 8t+4+b] << 4
 *       (b = 0..3), so the low nibbles are inputs 8t..8t+3 and the high nibbles 8t+4..8t+7;
 *   q8: 8 x 64 bytes; in the j-th 64 bytes, column c's 4 bytes hold q[c, 4j+b] + 128.
 *   scales: per block and group, 16 fp16 d (q4: then 16 fp16 m), as the GGUF blocks keep them.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GROUP 32
#define COLS 16          /* output columns per block */
#define ROWS 32          /* rows whose accumulators one pass over a block's weights keeps */
#ifndef PREFETCH
#define PREFETCH 2048    /* bytes ahead of the weights being multiplied */
#endif

enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512VNNI = 2 };

int bd_best_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) return ISA_AVX512VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
    return ISA_PORTABLE;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {   /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {   /* exact, as vcvtph2ps */
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu, u;
    if (e == 0) {
        float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Activations of one call: qx [rows, K], dx [rows, G] and, per group, dx * sum(qx) (q4's m term)
 * and sum(qx) (q8's +128 offset). */
typedef struct {
    int8_t *qx;
    float *dx, *sx;
    int32_t *sumq;
} Acts;

static void quantize_rows(const uint16_t *x, int rows, int K, Acts *a) {
    int G = K / GROUP;
    for (int r = 0; r < rows; r++) {
        for (int g = 0; g < G; g++) {
            const uint16_t *xs = x + (size_t)r * K + g * GROUP;
            float v[GROUP], amax = 0.0f;
            for (int k = 0; k < GROUP; k++) {
                v[k] = bf16_to_f32(xs[k]);
                float m = fabsf(v[k]);
                amax = m > amax ? m : amax;
            }
            float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
            int32_t s = 0;
            int8_t *q = a->qx + (size_t)r * K + g * GROUP;
            for (int k = 0; k < GROUP; k++) {
                float t = roundf(v[k] * id);
                t = t > 127.0f ? 127.0f : (t < -127.0f ? -127.0f : t);
                q[k] = (int8_t)t;
                s += q[k];
            }
            a->dx[(size_t)r * G + g] = d;
            a->sumq[(size_t)r * G + g] = s;
            a->sx[(size_t)r * G + g] = d * (float)s;
        }
    }
}

/* ---- the integer dot products of one (block, group): isum[c] = sum_k q[c, k] * qx[k], 16 columns ---- */

static void dot_portable(const uint8_t *w, const int8_t *qx, int bits, int32_t isum[COLS]) {
    for (int c = 0; c < COLS; c++) {
        int32_t s = 0;
        for (int k = 0; k < GROUP; k++) {
            int q;
            if (bits == 4) {
                int t = k / 8, hi = (k % 8) >= 4, b = k % 4;
                uint8_t byte = w[64 * t + 4 * c + b];
                q = hi ? byte >> 4 : byte & 15;
            } else {
                q = (int)w[64 * (k / 4) + 4 * c + k % 4] - 128;
            }
            s += q * qx[k];
        }
        isum[c] = s;
    }
}

/* ---- one block of 16 columns over all groups, for rows r0..r0+n-1 ---- */

static void block_portable(const uint8_t *w, const uint16_t *sc, int bits, int G, int K, const Acts *a, int r0,
                           int n, float *acc) {
    size_t wstride = bits == 4 ? 256 : 512, sstride = bits == 4 ? 32 : 16;
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = w + g * wstride;
        float d[COLS], m[COLS];
        for (int c = 0; c < COLS; c++) {
            d[c] = f16_to_f32(sc[g * sstride + c]);
            m[c] = bits == 4 ? f16_to_f32(sc[g * sstride + COLS + c]) : 0.0f;
        }
        for (int r = 0; r < n; r++) {
            size_t row = (size_t)(r0 + r);
            int32_t isum[COLS];
            dot_portable(wg, a->qx + row * K + g * GROUP, bits, isum);
            float ddx[COLS];
            for (int c = 0; c < COLS; c++) ddx[c] = d[c] * a->dx[row * G + g];
            for (int c = 0; c < COLS; c++) {
                float *o = acc + r * COLS + c;
                *o = fmaf((float)isum[c], ddx[c], *o);
                if (bits == 4) *o = fmaf(m[c], a->sx[row * G + g], *o);
            }
        }
    }
}

__attribute__((target("avx2,fma,f16c")))
static void block_avx2(const uint8_t *w, const uint16_t *sc, int bits, int G, int K, const Acts *a, int r0, int n,
                       float *acc) {
    const __m256i low = _mm256_set1_epi8(15), flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    size_t wstride = bits == 4 ? 256 : 512, sstride = bits == 4 ? 32 : 16;
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = w + g * wstride;
        for (size_t off = 0; off < wstride; off += 64) _mm_prefetch((const char *)(wg + PREFETCH + off), _MM_HINT_T0);
        __m256i wv[2][8];                                   /* [half][j]: columns 8h..8h+7, inputs 4j..4j+3 */
        for (int h = 0; h < 2; h++) {
            if (bits == 4) {
                for (int t = 0; t < 4; t++) {
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(wg + 64 * t + 32 * h));
                    wv[h][2 * t] = _mm256_and_si256(raw, low);
                    wv[h][2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                }
            } else {
                for (int j = 0; j < 8; j++)          /* q + 128 -> q as signed bytes */
                    wv[h][j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wg + 64 * j + 32 * h)), flip);
            }
        }
        const uint16_t *s = sc + g * sstride;
        __m256 d[2], m[2];
        for (int h = 0; h < 2; h++) {
            d[h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 8 * h)));
            m[h] = bits == 4 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + COLS + 8 * h))) : d[h];
        }
        for (int r = 0; r < n; r++) {
            size_t row = (size_t)(r0 + r);
            const int32_t *xq = (const int32_t *)(a->qx + row * K + g * GROUP);
            __m256 dx = _mm256_set1_ps(a->dx[row * G + g]), sx = _mm256_set1_ps(a->sx[row * G + g]);
            for (int h = 0; h < 2; h++) {
                __m256i isum = _mm256_setzero_si256();
                for (int j = 0; j < 8; j++) {
                    __m256i xb = _mm256_set1_epi32(xq[j]);
                    __m256i p = bits == 4 ? _mm256_maddubs_epi16(wv[h][j], xb)
                                          : _mm256_maddubs_epi16(_mm256_abs_epi8(xb), _mm256_sign_epi8(wv[h][j], xb));
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, ones));
                }
                float *o = acc + r * COLS + 8 * h;
                __m256 ddx = _mm256_mul_ps(d[h], dx);
                __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), ddx, _mm256_loadu_ps(o));
                if (bits == 4) v = _mm256_fmadd_ps(m[h], sx, v);
                _mm256_storeu_ps(o, v);
            }
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512vnni,fma")))
static void block_avx512(const uint8_t *w, const uint16_t *sc, int bits, int G, int K, const Acts *a, int r0, int n,
                         float *acc) {
    const __m512i low = _mm512_set1_epi8(15);
    size_t wstride = bits == 4 ? 256 : 512, sstride = bits == 4 ? 32 : 16;
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = w + g * wstride;
        for (size_t off = 0; off < wstride; off += 64) _mm_prefetch((const char *)(wg + PREFETCH + off), _MM_HINT_T0);
        __m512i wv[8];                                      /* [j]: 16 columns, inputs 4j..4j+3 */
        if (bits == 4) {
            for (int t = 0; t < 4; t++) {
                __m512i raw = _mm512_loadu_si512((const void *)(wg + 64 * t));
                wv[2 * t] = _mm512_and_si512(raw, low);
                wv[2 * t + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
            }
        } else {
            for (int j = 0; j < 8; j++) wv[j] = _mm512_loadu_si512((const void *)(wg + 64 * j));   /* q + 128 */
        }
        const uint16_t *s = sc + g * sstride;
        __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
        __m512 mv = bits == 4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + COLS))) : dv;
        for (int r = 0; r < n; r++) {
            size_t row = (size_t)(r0 + r);
            const int32_t *xq = (const int32_t *)(a->qx + row * K + g * GROUP);
            __m512i isum = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++) isum = _mm512_dpbusd_epi32(isum, wv[j], _mm512_set1_epi32(xq[j]));
            if (bits == 8) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(128 * a->sumq[row * G + g]));
            float *o = acc + r * COLS;
            __m512 ddx = _mm512_mul_ps(dv, _mm512_set1_ps(a->dx[row * G + g]));
            __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), ddx, _mm512_loadu_ps(o));
            if (bits == 4) v = _mm512_fmadd_ps(mv, _mm512_set1_ps(a->sx[row * G + g]), v);
            _mm512_storeu_ps(o, v);
        }
    }
}

/* out [rows, N] (bf16) = x [rows, K] (bf16) times the packed weight; N % 16 == 0, K % 32 == 0.
 * Returns 0, or -1 if scratch memory could not be had. */
int bd_qgemm(const uint16_t *x, int rows, int K, const uint8_t *w, const uint16_t *scales, int N, int bits,
             uint16_t *out, int isa, int threads) {
    int G = K / GROUP, blocks = N / COLS;
    Acts a;
    a.qx = malloc((size_t)rows * K);
    a.dx = malloc(sizeof(float) * (size_t)rows * G);
    a.sx = malloc(sizeof(float) * (size_t)rows * G);
    a.sumq = malloc(sizeof(int32_t) * (size_t)rows * G);
    if (!a.qx || !a.dx || !a.sx || !a.sumq) {
        free(a.qx); free(a.dx); free(a.sx); free(a.sumq);
        return -1;
    }
    quantize_rows(x, rows, K, &a);
    size_t wblock = (size_t)G * (bits == 4 ? 256 : 512), sblock = (size_t)G * (bits == 4 ? 32 : 16);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < blocks; b++) {
        float acc[ROWS * COLS];
        for (int r0 = 0; r0 < rows; r0 += ROWS) {
            int n = rows - r0 < ROWS ? rows - r0 : ROWS;
            memset(acc, 0, sizeof(float) * n * COLS);
            const uint8_t *wb = w + b * wblock;
            const uint16_t *sb = scales + b * sblock;
            if (isa == ISA_AVX512VNNI) block_avx512(wb, sb, bits, G, K, &a, r0, n, acc);
            else if (isa == ISA_AVX2) block_avx2(wb, sb, bits, G, K, &a, r0, n, acc);
            else block_portable(wb, sb, bits, G, K, &a, r0, n, acc);
            for (int r = 0; r < n; r++)
                for (int c = 0; c < COLS; c++) out[(size_t)(r0 + r) * N + b * COLS + c] = f32_to_bf16(acc[r * COLS + c]);
        }
    }
    free(a.qx); free(a.dx); free(a.sx); free(a.sumq);
    return 0;
}
