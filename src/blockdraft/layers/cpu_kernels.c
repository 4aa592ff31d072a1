/* blockdraft's CPU kernels: weight-only 4- and 8-bit matmuls, and the inference attention (below).
 * Compiled at first use by layers/cpu_kernels.py; no PyTorch headers, called through ctypes.
 *
 * Matmul numerics (the GGUF block formats):
 *   weights, per output column and group of 32 inputs:  q4: w = d*q + m, q in 0..15   (Q4_1)
 *                                                       q8: w = d*q,     q in -127..127 (Q8_0)
 *   activations, per row and group of 32:  x = dx*qx, qx in -32512..32512 (16 bits), dx = max|x|/32512,
 *                                          split qx = 256*hi + lo into two signed bytes;
 *                                          or, with 8-bit activations (act_bits 8, an explicit numerics
 *                                          choice): qx = 256*hi, hi = round(x*127/max|x|) in -127..127, lo = 0
 *   y[row, col] = sum over groups, in order, of  fma(float(sum_k q*qx), d*dx, acc)  (q4: then
 *                 fma(m, dx*sum_k qx, acc)), rounded once to bf16 at the end; sum_k q*qx is computed
 *                 as 256 * sum_k q*hi + sum_k q*lo with 8-bit integer dot products.
 * 16-bit activations keep the product as close to the bf16 activations' as the weights allow: mean KL
 * 0.00106 from fp32 on the default model (bf16: 0.00100; PyTorch's int4 kernel with bf16 scales:
 * 0.00157), where 8-bit ones, as llama.cpp and ONNX Runtime's int4 CPU path use, measured ~3x
 * PyTorch's kernel's KL (benchmarks/bench_costs.py fidelity).
 * 8-bit activations are the same formula with every lo byte 0: the paths that know it skip the lo products
 * (one tile row per activation row, half the dot products), and the sums and float operations are unchanged.
 * The inner sums are integers (exact), and every row runs the same float operations in the same
 * order whatever the row count, the thread count or the instruction set (AMX tiles, AVX512-VNNI, AVX2
 * and the portable path give the same bits): a verify over k+1 rows rounds each row exactly as a
 * one-row decoding step does, even where the row count picks another path.
 *
 * Weight layout, per block of 16 output columns and per group (written by layers/cpu_kernels.py):
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

/* AMX tiles need the intrinsics (GCC >= 11, clang >= 12) and, on Linux, the kernel's leave to use them */
#if defined(__linux__) && defined(__x86_64__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define BD_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define GROUP 32
#define COLS 16          /* output columns per block */
#define ROWS 32          /* rows whose accumulators one pass over a block's weights keeps */
#ifndef PREFETCH
#define PREFETCH 2048    /* bytes ahead of the weights being multiplied */
#endif

/* ISA_AMX chooses per pass of rows between the VNNI path and the two tile layouts below (all give the same
 * bits); ISA_AMX_INT8 and ISA_AMX_BF16 take one tile layout for every pass it can run (tests, benchmarks). */
enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512VNNI = 2, ISA_AMX = 3, ISA_AMX_INT8 = 4, ISA_AMX_BF16 = 5 };

/* Whether this process may run AMX int8 tiles: the CPU has them (CPUID.7.0:EDX bits 24 and 25) and Linux
 * grants the tile data state, which it hands out only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA; the grant is per process and idempotent). */
static int amx_granted(void) {
    static int granted = -1;         /* -1: not asked yet; asking again is harmless, so no lock */
    if (granted < 0) {
        granted = 0;
#ifdef BD_AMX
        unsigned a, b, c, d;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) && (d & (1u << 24)) && (d & (1u << 25)) &&
            __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi"))     /* BF16, TILE, INT8 */
            granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#endif
    }
    return granted;
}

int bd_best_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"))
        return amx_granted() ? ISA_AMX : ISA_AVX512VNNI;
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

__attribute__((target("avx2,fma")))
static inline __m256 load8_bf16(const uint16_t *p) {          /* bf16_to_f32 of 8 values */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
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

/* Activations of one call: hi and lo bytes [rows, K] interleaved by row (row r's hi bytes at hi + 2 half r, its
 * lo bytes at lo + 2 half r = hi + (2r + 1) half: a tile reads a row's two halves as two rows at stride half,
 * K plus padding), dx [rows, G]
 * and, per group, dx * sum(qx) (q4's m term) and the sums of hi and of lo (q8's +128 offset). */
typedef struct {
    int8_t *hi, *lo;
    size_t half;
    uint16_t *ab;          /* AMX bf16 path (q4): 256 hi and lo as bf16, row r's at ab + r 2 bhalf and + bhalf */
    size_t bhalf;          /* in bf16 elements */
    float *dx, *sx;
    int32_t *sumhi, *sumlo;
    int act8;              /* 8-bit activations: every lo byte is 0 */
} Acts;

#define QMAX 32512.0f      /* 127 * 256: qx = 256 * hi + lo with hi in -127..127 and lo in -128..127 */
#define QMAX8 127.0f       /* 8-bit activations: hi = round(x * 127 / max|x|), qx = 256 * hi */

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
            float qmax = a->act8 ? QMAX8 : QMAX;
            float d = amax / QMAX, id = amax > 0.0f ? qmax / amax : 0.0f;
            int32_t s = 0, sh = 0, sl = 0;
            int8_t *hi = a->hi + (size_t)r * 2 * a->half + g * GROUP, *lo = a->lo + (size_t)r * 2 * a->half + g * GROUP;
            for (int k = 0; k < GROUP; k++) {
                float t = roundf(v[k] * id);
                t = t > qmax ? qmax : (t < -qmax ? -qmax : t);
                int32_t q = (int32_t)t * (a->act8 ? 256 : 1), l = ((q & 0xff) ^ 0x80) - 0x80;   /* the low byte, signed */
                hi[k] = (int8_t)((q - l) / 256);
                lo[k] = (int8_t)l;
                s += q;
                sh += hi[k];
                sl += l;
            }
            a->dx[(size_t)r * G + g] = d;
            a->sumhi[(size_t)r * G + g] = sh;
            a->sumlo[(size_t)r * G + g] = sl;
            a->sx[(size_t)r * G + g] = d * (float)s;
        }
    }
}

/* The same activations as quantize_rows, 8 lanes at a time: every step is exact or the same single
 * rounding (|x| and the max, one product v * id, roundf's half-away-from-zero spelled as truncation plus
 * a step where the exact remainder is >= 0.5, integer sums), so the bytes and scales are identical. */
__attribute__((target("avx2,fma")))
static void quantize_rows_avx2(const uint16_t *x, int rows, int K, Acts *a) {
    int G = K / GROUP;
    const float qm = a->act8 ? QMAX8 : QMAX;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), half = _mm256_set1_ps(0.5f),
                 qmax = _mm256_set1_ps(qm), one = _mm256_set1_ps(1.0f);
    const int shift = a->act8 ? 8 : 0;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int r = 0; r < rows; r++) {
        for (int g = 0; g < G; g++) {
            const uint16_t *xs = x + (size_t)r * K + g * GROUP;
            __m256 v[4];
            for (int i = 0; i < 4; i++) v[i] = load8_bf16(xs + 8 * i);
            __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                                     _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            float d = amax / QMAX, id = amax > 0.0f ? qm / amax : 0.0f;
            __m256i q[4], hi[4], lo[4];
            for (int i = 0; i < 4; i++) {
                __m256 t = _mm256_mul_ps(v[i], _mm256_set1_ps(id));
                __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                __m256 up = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(t, tr), absmask), half, _CMP_GE_OQ);
                __m256 step = _mm256_or_ps(_mm256_and_ps(t, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))), one);
                t = _mm256_add_ps(tr, _mm256_and_ps(up, step));
                t = _mm256_min_ps(_mm256_max_ps(t, _mm256_sub_ps(_mm256_setzero_ps(), qmax)), qmax);
                q[i] = _mm256_slli_epi32(_mm256_cvttps_epi32(t), shift);
                lo[i] = _mm256_srai_epi32(_mm256_slli_epi32(q[i], 24), 24);           /* the low byte, signed */
                hi[i] = _mm256_srai_epi32(_mm256_sub_epi32(q[i], lo[i]), 8);
            }
            int8_t *hd = a->hi + (size_t)r * 2 * a->half + g * GROUP, *ld = a->lo + (size_t)r * 2 * a->half + g * GROUP;
            __m256i hb = _mm256_packs_epi16(_mm256_packs_epi32(hi[0], hi[1]), _mm256_packs_epi32(hi[2], hi[3]));
            __m256i lb = _mm256_packs_epi16(_mm256_packs_epi32(lo[0], lo[1]), _mm256_packs_epi32(lo[2], lo[3]));
            _mm256_storeu_si256((__m256i *)hd, _mm256_permutevar8x32_epi32(hb, order));
            _mm256_storeu_si256((__m256i *)ld, _mm256_permutevar8x32_epi32(lb, order));
            __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m256i sh = _mm256_add_epi32(_mm256_add_epi32(hi[0], hi[1]), _mm256_add_epi32(hi[2], hi[3]));
            __m256i sl = _mm256_add_epi32(_mm256_add_epi32(lo[0], lo[1]), _mm256_add_epi32(lo[2], lo[3]));
            int32_t ts[8], th[8], tl[8];
            _mm256_storeu_si256((__m256i *)ts, s);
            _mm256_storeu_si256((__m256i *)th, sh);
            _mm256_storeu_si256((__m256i *)tl, sl);
            int32_t s1 = 0, h1 = 0, l1 = 0;
            for (int i = 0; i < 8; i++) {
                s1 += ts[i];
                h1 += th[i];
                l1 += tl[i];
            }
            a->dx[(size_t)r * G + g] = d;
            a->sumhi[(size_t)r * G + g] = h1;
            a->sumlo[(size_t)r * G + g] = l1;
            a->sx[(size_t)r * G + g] = d * (float)s1;
        }
    }
}

/* ---- the integer dot products of one (block, group): isum[c] = sum_k q[c, k] * qx[k], 16 columns ---- */

static void dot_portable(const uint8_t *w, const int8_t *hi8, const int8_t *lo8, int bits, int32_t isum[COLS]) {
    for (int c = 0; c < COLS; c++) {
        int32_t sh = 0, sl = 0;
        for (int k = 0; k < GROUP; k++) {
            int q;
            if (bits == 4) {
                int t = k / 8, hi = (k % 8) >= 4, b = k % 4;
                uint8_t byte = w[64 * t + 4 * c + b];
                q = hi ? byte >> 4 : byte & 15;
            } else {
                q = (int)w[64 * (k / 4) + 4 * c + k % 4] - 128;
            }
            sh += q * hi8[k];
            sl += q * lo8[k];
        }
        isum[c] = sh * 256 + sl;
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
            dot_portable(wg, a->hi + row * 2 * a->half + g * GROUP, a->lo + row * 2 * a->half + g * GROUP, bits, isum);
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

/* R rows (a constant where it is inlined) over all groups of one block, their 16 sums each (two halves of
 * 8 columns) in registers; bits and A8 (8-bit activations: the lo products, all 0, are skipped) are constants
 * too */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void tile_avx2(const uint8_t *w, const uint16_t *sc, const int bits, int G, const Acts *a, int r0,
                             float *acc, const int R, const int A8) {
    const __m256i low = _mm256_set1_epi8(15), flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1),
                  h256 = _mm256_set1_epi16(256);
    size_t wstride = bits == 4 ? 256 : 512, sstride = bits == 4 ? 32 : 16;
    __m256 o[3][2];
    for (int r = 0; r < R; r++) o[r][0] = o[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = w + g * wstride;
        for (size_t off = 0; off < wstride; off += 64) _mm_prefetch((const char *)(wg + PREFETCH + off), _MM_HINT_T0);
        const int32_t *xh[3], *xl[3];
        for (int r = 0; r < R; r++) {
            xh[r] = (const int32_t *)(a->hi + (size_t)(r0 + r) * 2 * a->half + g * GROUP);
            xl[r] = (const int32_t *)(a->lo + (size_t)(r0 + r) * 2 * a->half + g * GROUP);
        }
        __m256i isum[3][2];
        if (bits == 4) {        /* |pair| <= 2*15*128, 8 of them fit int16: widen once */
            __m256i ah[3][2], al[3][2];
            for (int r = 0; r < R; r++) ah[r][0] = ah[r][1] = al[r][0] = al[r][1] = _mm256_setzero_si256();
            for (int t = 0; t < 4; t++)
                for (int h = 0; h < 2; h++) {
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(wg + 64 * t + 32 * h));
                    __m256i w0 = _mm256_and_si256(raw, low), w1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                    for (int r = 0; r < R; r++) {
                        __m256i ph = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_set1_epi32(xh[r][2 * t])),
                                                      _mm256_maddubs_epi16(w1, _mm256_set1_epi32(xh[r][2 * t + 1])));
                        ah[r][h] = _mm256_add_epi16(ah[r][h], ph);
                        if (A8) continue;
                        __m256i pl = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_set1_epi32(xl[r][2 * t])),
                                                      _mm256_maddubs_epi16(w1, _mm256_set1_epi32(xl[r][2 * t + 1])));
                        al[r][h] = _mm256_add_epi16(al[r][h], pl);
                    }
                }
            for (int r = 0; r < R; r++)
                for (int h = 0; h < 2; h++)
                    isum[r][h] = A8 ? _mm256_madd_epi16(ah[r][h], h256)
                                    : _mm256_add_epi32(_mm256_madd_epi16(ah[r][h], h256), _mm256_madd_epi16(al[r][h], ones));
        } else {                /* |pair| <= 2*127*128: widen every product */
            __m256i ih[3][2], il[3][2];
            for (int r = 0; r < R; r++) ih[r][0] = ih[r][1] = il[r][0] = il[r][1] = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++)
                for (int h = 0; h < 2; h++) {    /* q + 128 -> q as signed bytes */
                    __m256i wj = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wg + 64 * j + 32 * h)), flip);
                    for (int r = 0; r < R; r++) {
                        __m256i bh = _mm256_set1_epi32(xh[r][j]);
                        __m256i ph = _mm256_maddubs_epi16(_mm256_abs_epi8(bh), _mm256_sign_epi8(wj, bh));
                        ih[r][h] = _mm256_add_epi32(ih[r][h], _mm256_madd_epi16(ph, ones));
                        if (A8) continue;
                        __m256i bl = _mm256_set1_epi32(xl[r][j]);
                        __m256i pl = _mm256_maddubs_epi16(_mm256_abs_epi8(bl), _mm256_sign_epi8(wj, bl));
                        il[r][h] = _mm256_add_epi32(il[r][h], _mm256_madd_epi16(pl, ones));
                    }
                }
            for (int r = 0; r < R; r++)
                for (int h = 0; h < 2; h++)
                    isum[r][h] = A8 ? _mm256_slli_epi32(ih[r][h], 8) : _mm256_add_epi32(_mm256_slli_epi32(ih[r][h], 8), il[r][h]);
        }
        const uint16_t *s = sc + g * sstride;
        for (int h = 0; h < 2; h++) {
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 8 * h)));
            __m256 m = bits == 4 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + COLS + 8 * h))) : d;
            for (int r = 0; r < R; r++) {
                size_t row = (size_t)(r0 + r);
                __m256 ddx = _mm256_mul_ps(d, _mm256_set1_ps(a->dx[row * G + g]));
                o[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][h]), ddx, o[r][h]);
                if (bits == 4) o[r][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(a->sx[row * G + g]), o[r][h]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(acc + r * COLS + 8 * h, o[r][h]);
}

/* n rows of one block in tiles of 3; bits and A8 are constants where it is inlined */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void tiles_avx2(const uint8_t *w, const uint16_t *sc, const int bits, int G, const Acts *a, int r0,
                              int n, float *acc, const int A8) {
    int r = 0;
    for (; r + 3 <= n; r += 3) tile_avx2(w, sc, bits, G, a, r0 + r, acc + r * COLS, 3, A8);
    switch (n - r) {
        case 2: tile_avx2(w, sc, bits, G, a, r0 + r, acc + r * COLS, 2, A8); break;
        case 1: tile_avx2(w, sc, bits, G, a, r0 + r, acc + r * COLS, 1, A8); break;
    }
}

/* tiles(...) with the weight width and 8-bit activations as constants, so that each case is compiled on its own */
#define WITH_CONSTANTS(tiles)                                                 \
    if (bits == 4 && a->act8) tiles(w, sc, 4, G, a, r0, n, acc, 1);          \
    else if (bits == 4) tiles(w, sc, 4, G, a, r0, n, acc, 0);                \
    else if (a->act8) tiles(w, sc, 8, G, a, r0, n, acc, 1);                  \
    else tiles(w, sc, 8, G, a, r0, n, acc, 0)

__attribute__((target("avx2,fma,f16c")))
static void block_avx2(const uint8_t *w, const uint16_t *sc, int bits, int G, const Acts *a, int r0, int n,
                       float *acc) {
    WITH_CONSTANTS(tiles_avx2);
}

/* The VNNI path's integer group sums of one row: its hi and lo bytes (dwords xh[j], xl[j]) against the 8
 * weight vectors (wv[j]: 16 columns, inputs 4j..4j+3), two chains each; exact. With 8-bit activations (A8,
 * a constant where it is inlined) the lo sum is 0 and not computed. */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline))
static inline void vnni_sums(const __m512i wv[8], const int32_t *xh, const int32_t *xl, __m512i *hi, __m512i *lo,
                             const int A8) {
    if (A8) {
        __m512i ih = _mm512_setzero_si512(), jh = _mm512_setzero_si512();
        for (int j = 0; j < 8; j += 2) {
            ih = _mm512_dpbusd_epi32(ih, wv[j], _mm512_set1_epi32(xh[j]));
            jh = _mm512_dpbusd_epi32(jh, wv[j + 1], _mm512_set1_epi32(xh[j + 1]));
        }
        *hi = _mm512_add_epi32(ih, jh);
        *lo = _mm512_setzero_si512();
        return;
    }
    __m512i ih = _mm512_setzero_si512(), il = _mm512_setzero_si512();
    __m512i jh = _mm512_setzero_si512(), jl = _mm512_setzero_si512();
    for (int j = 0; j < 8; j += 2) {
        ih = _mm512_dpbusd_epi32(ih, wv[j], _mm512_set1_epi32(xh[j]));
        il = _mm512_dpbusd_epi32(il, wv[j], _mm512_set1_epi32(xl[j]));
        jh = _mm512_dpbusd_epi32(jh, wv[j + 1], _mm512_set1_epi32(xh[j + 1]));
        jl = _mm512_dpbusd_epi32(jl, wv[j + 1], _mm512_set1_epi32(xl[j + 1]));
    }
    *hi = _mm512_add_epi32(ih, jh);
    *lo = _mm512_add_epi32(il, jl);
}

/* One row's float epilogue for one group, the same on every AVX512 and AMX path, from its exact integer sum
 * isum = sum_k q*qx: acc = fma(isum, d dx, acc), then q4's acc = fma(m, dx sum(qx), acc). `at` = row * G + group. */
__attribute__((target("avx512f,avx512bw,fma"), always_inline))
static inline __m512 sum_epilogue(__m512i isum, __m512 dv, __m512 mv, int bits, const Acts *a, size_t at, __m512 acc) {
    __m512 ddx = _mm512_mul_ps(dv, _mm512_set1_ps(a->dx[at]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), ddx, acc);
    return bits == 4 ? _mm512_fmadd_ps(mv, _mm512_set1_ps(a->sx[at]), acc) : acc;
}

/* sum_epilogue from the hi and lo sums: q8's +128 offset taken off each, isum = 256 hi + lo. */
__attribute__((target("avx512f,avx512bw,fma"), always_inline))
static inline __m512 group_epilogue(__m512i ih, __m512i il, __m512 dv, __m512 mv, int bits, const Acts *a, size_t at,
                                    __m512 acc) {
    if (bits == 8) {          /* the weights were stored + 128 */
        ih = _mm512_sub_epi32(ih, _mm512_set1_epi32(128 * a->sumhi[at]));
        il = _mm512_sub_epi32(il, _mm512_set1_epi32(128 * a->sumlo[at]));
    }
    return sum_epilogue(_mm512_add_epi32(_mm512_slli_epi32(ih, 8), il), dv, mv, bits, a, at, acc);
}

/* acc + VPDPBUSD(w, the dword at p in every lane), the dword read by the instruction's own broadcast: GCC
 * otherwise spends a broadcast instruction and a register on it */
__attribute__((target("avx512f,avx512vnni"), always_inline))
static inline __m512i dpbusd_dword(__m512i acc, __m512i w, const int32_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
    return acc;
}

#define VNNI_ROWS 9       /* rows one pass over a block's weights keeps in registers on the VNNI path */
#define VNNI_CHAINS 4     /* up to this many rows, each row's sums run in 4 chains (8-bit activations: 2); above
                             it, one chain a row */

/* R <= VNNI_ROWS rows (a constant where it is inlined) over all groups of one block of `bits`-bit weights, their
 * 16 sums each in registers; A8: the activations are 8-bit (bits and A8 are constants too). Up to VNNI_CHAINS
 * rows, each row's hi and lo sums run in two chains each (vnni_sums) so that one row does not wait on its own
 * products; above it, the rows' chains interleave, one a row: the hi products, a shift by 8, then the lo
 * products added on (the same exact sum 256 hi + lo in fewer instructions). */
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"), always_inline))
static inline void tile_avx512(const uint8_t *w, const uint16_t *sc, const int bits, int G, const Acts *a, int r0,
                               float *acc, const int R, const int A8) {
    const __m512i low = _mm512_set1_epi8(15);
    size_t wstride = bits == 4 ? 256 : 512, sstride = bits == 4 ? 32 : 16;
    __m512 o[VNNI_ROWS];
    for (int r = 0; r < R; r++) o[r] = _mm512_setzero_ps();
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
        const int32_t *xh[VNNI_ROWS], *xl[VNNI_ROWS];       /* row r's activation bytes in this group, 4 a dword */
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            xh[r] = (const int32_t *)(a->hi + (size_t)(r0 + r) * 2 * a->half + g * GROUP);
            xl[r] = (const int32_t *)(a->lo + (size_t)(r0 + r) * 2 * a->half + g * GROUP);
        }
        if (R <= VNNI_CHAINS) {
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                __m512i ih, il;
                vnni_sums(wv, xh[r], xl[r], &ih, &il, A8);
                o[r] = group_epilogue(ih, il, dv, mv, bits, a, (size_t)(r0 + r) * G + g, o[r]);
            }
            continue;
        }
        __m512i isum[VNNI_ROWS];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) isum[r] = dpbusd_dword(isum[r], wv[j], xh[r] + j);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) isum[r] = _mm512_slli_epi32(isum[r], 8);
        if (!A8)
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
#pragma GCC unroll 16
                for (int r = 0; r < R; r++) isum[r] = dpbusd_dword(isum[r], wv[j], xl[r] + j);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            size_t at = (size_t)(r0 + r) * G + g;
            if (bits == 8)    /* the weights were stored + 128: take off 128 (256 sum(hi) + sum(lo)) */
                isum[r] = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(128 * (256 * a->sumhi[at] + a->sumlo[at])));
            o[r] = sum_epilogue(isum[r], dv, mv, bits, a, at, o[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(acc + r * COLS, o[r]);
}

#define TILE_AVX512_CASE(R) case R: tile_avx512(w, sc, bits, G, a, r0 + r, acc + r * COLS, R, A8); break;

/* n rows of one block in passes of up to VNNI_ROWS; bits and A8 are constants where it is inlined */
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"), always_inline))
static inline void tiles_avx512(const uint8_t *w, const uint16_t *sc, const int bits, int G, const Acts *a, int r0,
                                int n, float *acc, const int A8) {
    for (int r = 0; r < n; r += VNNI_ROWS) {
        switch (n - r < VNNI_ROWS ? n - r : VNNI_ROWS) {
            TILE_AVX512_CASE(1) TILE_AVX512_CASE(2) TILE_AVX512_CASE(3) TILE_AVX512_CASE(4) TILE_AVX512_CASE(5)
            TILE_AVX512_CASE(6) TILE_AVX512_CASE(7) TILE_AVX512_CASE(8) TILE_AVX512_CASE(9)
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512vnni,fma")))
static void block_avx512(const uint8_t *w, const uint16_t *sc, int bits, int G, const Acts *a, int r0, int n,
                         float *acc) {
    WITH_CONSTANTS(tiles_avx512);
}

#ifdef BD_AMX
/* ---- AMX: the integer group sums of up to 16 rows x 16 columns per group in tiles ----
 * TDPBSUD multiplies signed activation bytes (tile A: a group's 32 inputs of up to 8 rows, each row's hi
 * and lo bytes as two tile rows) by unsigned weight bytes (tile B: 8 x 64, row j = inputs 4j..4j+3 of the
 * 16 columns, the layout the weights are packed in) into int32 (tile C: the hi and the lo sums of each
 * row): the same exact sums as the VNNI path's, so the float epilogue below (the same operations in the
 * same order per row, column and group) gives the same bits. Tiles 0/1: A for rows 0-7 / 8-15 of the
 * pass, 2: B, 3/4: C for rows 0-7 / 8-15. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

#define AMX_ROWS 16      /* rows per pass over a block's weights */

enum { LAYOUT_INT8 = 0, LAYOUT_BF16 = 1, LAYOUT_A8 = 2 };

/* Configure the tiles for passes of n rows, as the int8 (tile_amx), the bf16 (tile_amx_bf16) or the 8-bit
 * activations' (tile_amx_a8) pass lays them out; once per thread, layout and row count (released by
 * amx_release). Where a group's product takes 3 or 4 tiles, a second set of the same shapes (tiles 4-7) lets
 * the passes below alternate between the two by group: a group's product runs while the one before it is
 * stored, where one set makes each wait for the other. */
__attribute__((target("amx-tile")))
static void amx_configure(int n, int layout, int *configured) {
    int key = n + 64 * (layout + 1);
    if (*configured == key) return;
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    if (layout == LAYOUT_A8) {   /* 0: A (n rows' hi bytes, n x 32), 2: B (8 x 64), 3: C (n x 16 int32) */
        cfg.rows[0] = cfg.rows[3] = (uint8_t)n;
        cfg.colsb[0] = GROUP, cfg.colsb[3] = 64;
        cfg.rows[2] = GROUP / 4, cfg.colsb[2] = 64;
    } else if (layout == LAYOUT_BF16) {                  /* 0/1: A (256 hi / lo, n x 32 bf16), 2: B (16 pairs x 16 columns), 3: C (n x 16) */
        cfg.rows[0] = cfg.rows[1] = cfg.rows[3] = (uint8_t)n;
        cfg.colsb[0] = cfg.colsb[1] = cfg.colsb[3] = 64;
        cfg.rows[2] = GROUP / 2, cfg.colsb[2] = 64;
    } else {
        int first = n < 8 ? n : 8, second = n - first;
        cfg.rows[0] = (uint8_t)(2 * first), cfg.colsb[0] = GROUP;
        cfg.rows[2] = GROUP / 4, cfg.colsb[2] = 64;
        cfg.rows[3] = (uint8_t)(2 * first), cfg.colsb[3] = 64;
        if (second) {
            cfg.rows[1] = (uint8_t)(2 * second), cfg.colsb[1] = GROUP;
            cfg.rows[4] = (uint8_t)(2 * second), cfg.colsb[4] = 64;
        }
    }
    if (layout != LAYOUT_INT8 || n <= 8)                 /* the second set: tile t's shape in tile t + 4 */
        for (int t = 0; t < 4; t++) cfg.rows[t + 4] = cfg.rows[t], cfg.colsb[t + 4] = cfg.colsb[t];
    /* not _tile_loadconfig: GCC 12 spells its operand as 8 bytes, so the stores to the rest of cfg may be
     * dropped as dead (seen: a #GP on a garbage config) */
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
    *configured = key;
}

__attribute__((target("amx-tile")))
static void amx_release(int *configured) {
    if (*configured) _tile_release();
    *configured = 0;
}

#ifndef AMX_AHEAD
#define AMX_AHEAD 4      /* groups between the stages of the pipelines below */
#endif

/* Group t's int8 tile product into tile C: B = its weight bytes `wt` (8 x 64), A = its activation rows at
 * `stride` bytes apart. Tile numbers must be literals, hence macros. */
#define INT8_PRODUCT(A, B, C, wt, at, stride) \
    do { _tile_loadd(B, wt, 64); _tile_loadd(A, at, stride); _tile_zero(C); _tile_dpbsud(C, A, B); } while (0)
/* the sums of group g from its set's C tile (3 for even groups, 7 for odd) into `dst` */
#define STORE_SUMS(g, dst) do { if ((g) & 1) _tile_stored(7, dst, 64); else _tile_stored(3, dst, 64); } while (0)
#define AMX_RING 8       /* buffers per stage: a power of two > AMX_AHEAD (unpacked weights: twice that, so
                            the epilogue's extra vector row can read them 2 AMX_AHEAD groups after) */

/* R rows (a constant where it is inlined, 1..AMX_ROWS) over all groups of one block, their 16 sums each
 * in registers, as tile_avx512 computes them. Each group goes through three stages AMX_AHEAD groups apart,
 * interleaved with the other groups' so that tile and vector work overlap: its weights unpacked to bytes
 * (vector stores), its tile products (tile loads of those bytes, a tile store of the sums), its float
 * epilogue (vector loads of the sums). No load then waits on a store still in flight (a tile load of
 * just-stored bytes, or a vector load of a just-stored tile, stalls for ~100 cycles). Up to 8 rows, groups
 * alternate between two sets of tiles and each group's sums are stored one group later, after the next
 * group's product is issued: a tile store waits for its product to finish, and the next group's product
 * does not wait behind it. */
__attribute__((target("avx512f,avx512bw,avx512vnni,fma,amx-tile,amx-int8"), always_inline))
static inline void tile_amx(const uint8_t *w, const uint16_t *sc, int bits, int G, int K, const Acts *a, int r0,
                            float *acc, const int R, const int V) {
    const __m512i low = _mm512_set1_epi8(15);
    size_t wstride = bits == 4 ? 256 : 512, sstride = bits == 4 ? 32 : 16;
    uint8_t unpacked[2 * AMX_RING][512] __attribute__((aligned(64)));
    int32_t sums[AMX_RING][2 * R][COLS] __attribute__((aligned(64)));   /* [.., 2r + (0: hi, 1: lo), col] */
    const int8_t *hl = a->hi + (size_t)r0 * 2 * a->half, *hl8 = hl + (size_t)8 * 2 * a->half;
    __m512 o[AMX_ROWS], ov = _mm512_setzero_ps();
    for (int r = 0; r < R; r++) o[r] = _mm512_setzero_ps();
    (void)K;
    for (int i = -2 * AMX_AHEAD; i < G; i++) {
        int p = i + 2 * AMX_AHEAD, t = i + AMX_AHEAD;
        if (p < G) {                                    /* stage 1: unpack (q4) or prefetch (q8) group p */
            const uint8_t *wg = w + p * wstride;
            for (size_t off = 0; off < wstride; off += 64) _mm_prefetch((const char *)(wg + PREFETCH + off), _MM_HINT_T0);
            if (bits == 4)
                for (int c = 0; c < 4; c++) {        /* row 2c: low nibbles of 64-byte chunk c; 2c + 1: high */
                    __m512i raw = _mm512_loadu_si512((const void *)(wg + 64 * c));
                    uint8_t *dst = unpacked[p & (2 * AMX_RING - 1)] + 128 * c;
                    _mm512_store_si512((void *)dst, _mm512_and_si512(raw, low));
                    _mm512_store_si512((void *)(dst + 64), _mm512_and_si512(_mm512_srli_epi16(raw, 4), low));
                }
        }
        /* B: q4's unpacked bytes, or q8's q + 128; A: row 2r: row r's hi bytes, 2r + 1: its lo bytes */
        const uint8_t *wt = t >= 0 && t < G ? (bits == 4 ? unpacked[t & (2 * AMX_RING - 1)] : w + t * wstride) : NULL;
        if (R <= 8 && t >= 0 && t <= G) {              /* stage 2: the tile product of group t, the store of t - 1's */
            if (t < G) {
                if (t & 1) INT8_PRODUCT(4, 6, 7, wt, hl + t * GROUP, a->half);
                else INT8_PRODUCT(0, 2, 3, wt, hl + t * GROUP, a->half);
            }
            if (t > 0) STORE_SUMS(t - 1, sums[(t - 1) & (AMX_RING - 1)][0]);
        }
        if (R > 8 && t >= 0 && t < G) {                /* stage 2, two tiles of rows: the products of group t */
            int32_t (*dst)[COLS] = sums[t & (AMX_RING - 1)];
            INT8_PRODUCT(0, 2, 3, wt, hl + t * GROUP, a->half);
            _tile_stored(3, dst[0], 64);
            _tile_loadd(1, hl8 + t * GROUP, a->half);
            _tile_zero(4);
            _tile_dpbsud(4, 1, 2);
            _tile_stored(4, dst[16], 64);
        }
        if (i >= 0) {                                   /* stage 3: the epilogue of group i */
            int g = i;
            int32_t (*src)[COLS] = sums[g & (AMX_RING - 1)];
            const uint16_t *s = sc + g * sstride;
            __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
            __m512 mv = bits == 4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + COLS))) : dv;
            for (int r = 0; r < R; r++) {
                size_t row = (size_t)(r0 + r);
                o[r] = group_epilogue(_mm512_load_si512((const void *)src[2 * r]),
                                      _mm512_load_si512((const void *)src[2 * r + 1]), dv, mv, bits, a, row * G + g, o[r]);
            }
            if (V) {                  /* row R on the vector units, as tile_avx512 computes it, beside the tile */
                const uint8_t *wb = bits == 4 ? unpacked[g & (2 * AMX_RING - 1)] : w + g * wstride;
                size_t row = (size_t)(r0 + R);
                __m512i wv[8], ih, il;
                for (int j = 0; j < 8; j++) wv[j] = _mm512_loadu_si512((const void *)(wb + 64 * j));
                vnni_sums(wv, (const int32_t *)(a->hi + row * 2 * a->half + g * GROUP),
                          (const int32_t *)(a->lo + row * 2 * a->half + g * GROUP), &ih, &il, 0);
                ov = group_epilogue(ih, il, dv, mv, bits, a, row * G + g, ov);
            }
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(acc + r * COLS, o[r]);
    if (V) _mm512_storeu_ps(acc + R * COLS, ov);
}

/* 8-bit activations: R rows (a constant where it is inlined, 1..AMX_ROWS) over all groups of one block, as
 * tile_amx with every lo byte 0: tile A holds each row's hi bytes only (stride 2 half skips the lo bytes), so
 * one product a group serves 16 rows, and the epilogue takes a lo sum of 0, as the VNNI path's A8 sums do. */
__attribute__((target("avx512f,avx512bw,avx512vnni,fma,amx-tile,amx-int8"), always_inline))
static inline void tile_amx_a8(const uint8_t *w, const uint16_t *sc, int bits, int G, const Acts *a, int r0,
                               float *acc, const int R) {
    const __m512i low = _mm512_set1_epi8(15), zero = _mm512_setzero_si512();
    size_t wstride = bits == 4 ? 256 : 512, sstride = bits == 4 ? 32 : 16;
    uint8_t unpacked[AMX_RING][512] __attribute__((aligned(64)));
    int32_t sums[AMX_RING][R][COLS] __attribute__((aligned(64)));
    const int8_t *hl = a->hi + (size_t)r0 * 2 * a->half;
    __m512 o[AMX_ROWS];
    for (int r = 0; r < R; r++) o[r] = _mm512_setzero_ps();
    for (int i = -2 * AMX_AHEAD; i < G; i++) {
        int p = i + 2 * AMX_AHEAD, t = i + AMX_AHEAD;
        if (p < G) {                                    /* stage 1: unpack (q4) or prefetch (q8) group p */
            const uint8_t *wg = w + p * wstride;
            for (size_t off = 0; off < wstride; off += 64) _mm_prefetch((const char *)(wg + PREFETCH + off), _MM_HINT_T0);
            if (bits == 4)
                for (int c = 0; c < 4; c++) {
                    __m512i raw = _mm512_loadu_si512((const void *)(wg + 64 * c));
                    uint8_t *dst = unpacked[p & (AMX_RING - 1)] + 128 * c;
                    _mm512_store_si512((void *)dst, _mm512_and_si512(raw, low));
                    _mm512_store_si512((void *)(dst + 64), _mm512_and_si512(_mm512_srli_epi16(raw, 4), low));
                }
        }
        if (t >= 0 && t <= G) {                         /* stage 2: the tile product of group t, the store of t - 1's */
            if (t < G) {                                /* A: the rows' hi bytes (2 half apart: the lo bytes skipped) */
                const uint8_t *wt = bits == 4 ? unpacked[t & (AMX_RING - 1)] : w + t * wstride;
                if (t & 1) INT8_PRODUCT(4, 6, 7, wt, hl + t * GROUP, 2 * a->half);
                else INT8_PRODUCT(0, 2, 3, wt, hl + t * GROUP, 2 * a->half);
            }
            if (t > 0) STORE_SUMS(t - 1, sums[(t - 1) & (AMX_RING - 1)]);
        }
        if (i >= 0) {                                   /* stage 3: the epilogue of group i */
            int g = i;
            const uint16_t *s = sc + g * sstride;
            __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
            __m512 mv = bits == 4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + COLS))) : dv;
            for (int r = 0; r < R; r++)
                o[r] = group_epilogue(_mm512_load_si512((const void *)sums[g & (AMX_RING - 1)][r]), zero, dv, mv, bits,
                                      a, (size_t)(r0 + r) * G + g, o[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(acc + r * COLS, o[r]);
}

/* ---- AMX bf16 (4-bit weights): one fp32 tile of exact group sums for up to 16 rows ----
 * TDPBF16PS over A = 256 hi (exact in bf16: 7 significant bits) and then A = lo, against B = the weights as
 * bf16 (0..15, exact), accumulates sum_k q (256 hi + lo) = sum_k q qx in fp32. Every product and partial sum
 * is an integer of magnitude <= 32 * 15 * (127 * 256 + 128) < 2^24, so none is rounded, whatever order the
 * instruction adds them in: the tile holds float(isum) exactly, and the epilogue's operations are those of
 * the VNNI path. One tile store per group for 16 rows (the int8 tiles take one per 8 rows). */

/* row r's bf16 copies of its hi and lo bytes (x 256 and x 1), as tile A reads them */
__attribute__((target("avx512f,avx512bw")))
static void acts_bf16(Acts *a, int rows, int K) {
    for (int r = 0; r < rows; r++) {
        const int8_t *hi = a->hi + (size_t)r * 2 * a->half, *lo = a->lo + (size_t)r * 2 * a->half;
        uint16_t *dh = a->ab + (size_t)r * 2 * a->bhalf, *dl = dh + a->bhalf;
        for (int k = 0; k < K; k += 16) {       /* exact floats: their top 16 bits are their bf16 */
            __m512 fh = _mm512_cvtepi32_ps(_mm512_slli_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(hi + k))), 8));
            __m512 fl = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(lo + k))));
            _mm256_storeu_si256((__m256i *)(dh + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(fh), 16)));
            _mm256_storeu_si256((__m256i *)(dl + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(fl), 16)));
        }
    }
}

/* The B tile of one group (256 packed bytes -> 16 rows of 64 bytes): row 4t + s holds, per column, the bf16
 * of inputs 8t + 2s' and 8t + 2s' + 1 (s' = s % 2, from the high nibbles where s >= 2). Each row is one
 * VPMULTISHIFTQB (the two source bytes' nibble into the low bits of two index words) and one VPERMW (the
 * bf16 of the index's low 5 bits, 0..15 twice over). */
__attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline))
static inline void weights_bf16(const uint8_t *wg, uint8_t *dst) {
    const __m512i table = _mm512_setr_epi32(0x3f800000, 0x40404000, 0x40a04080, 0x40e040c0, 0x41104100,
                                            0x41304120, 0x41504140, 0x41704160, 0x3f800000, 0x40404000,
                                            0x40a04080, 0x40e040c0, 0x41104100, 0x41304120, 0x41504140,
                                            0x41704160);
    /* bit offsets, per qword (two columns), of the bytes feeding each index word: low nibbles of bytes 0/1
     * and 2/3 of each column's dword, then the high nibbles */
    const __m512i shifts[4] = {_mm512_set1_epi64(0x2828202008080000LL), _mm512_set1_epi64(0x3838303018181010LL),
                               _mm512_set1_epi64(0x2c2c24240c0c0404LL), _mm512_set1_epi64(0x3c3c34341c1c1414LL)};
    for (int t = 0; t < 4; t++) {
        __m512i raw = _mm512_loadu_si512((const void *)(wg + 64 * t));
        _mm_prefetch((const char *)(wg + PREFETCH + 64 * t), _MM_HINT_T0);
        for (int s = 0; s < 4; s++)
            _mm512_store_si512((void *)(dst + 64 * (4 * t + s)),
                               _mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(shifts[s], raw), table));
    }
}

/* R rows (a constant where it is inlined, 1..AMX_ROWS) over all groups of one block of 4-bit weights, as
 * tile_amx, in the same three stages */
__attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vnni,fma,amx-tile,amx-bf16"), always_inline))
static inline void tile_amx_bf16(const uint8_t *w, const uint16_t *sc, int G, const Acts *a, int r0, float *acc,
                                 const int R) {
    uint8_t prepared[AMX_RING][1024] __attribute__((aligned(64)));
    float sums[AMX_RING][R][COLS] __attribute__((aligned(64)));
    const uint16_t *ah = a->ab + (size_t)r0 * 2 * a->bhalf, *al = ah + a->bhalf;
    const size_t stride = 4 * a->bhalf;                   /* bytes from one row's bf16 copies to the next's */
    __m512 o[AMX_ROWS];
    for (int r = 0; r < R; r++) o[r] = _mm512_setzero_ps();
    for (int i = -2 * AMX_AHEAD; i < G; i++) {
        int p = i + 2 * AMX_AHEAD, t = i + AMX_AHEAD;
        if (p < G) weights_bf16(w + (size_t)p * 256, prepared[p & (AMX_RING - 1)]);    /* stage 1: B of group p */
#define BF16_PRODUCTS(AH, AL, B, C)                                                                       \
    do {                                                                                                  \
        _tile_loadd(B, prepared[t & (AMX_RING - 1)], 64);                                                 \
        _tile_loadd(AH, ah + t * GROUP, stride);                                                          \
        _tile_loadd(AL, al + t * GROUP, stride);                                                          \
        _tile_zero(C);                                                                                    \
        _tile_dpbf16ps(C, AH, B);                                                                         \
        _tile_dpbf16ps(C, AL, B);                                                                         \
    } while (0)
        if (t >= 0 && t <= G) {                         /* stage 2: the tile products of group t, the store of t - 1's */
            if (t < G) {
                if (t & 1) BF16_PRODUCTS(4, 5, 6, 7);
                else BF16_PRODUCTS(0, 1, 2, 3);
            }
            if (t > 0) STORE_SUMS(t - 1, sums[(t - 1) & (AMX_RING - 1)]);
        }
#undef BF16_PRODUCTS
        if (i >= 0) {                                   /* stage 3: the epilogue of group i */
            int g = i;
            const uint16_t *s = sc + g * 32;
            __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
            __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + COLS)));
            for (int r = 0; r < R; r++) {
                size_t row = (size_t)(r0 + r);
                __m512 ddx = _mm512_mul_ps(dv, _mm512_set1_ps(a->dx[row * G + g]));
                o[r] = _mm512_fmadd_ps(_mm512_load_ps(sums[g & (AMX_RING - 1)][r]), ddx, o[r]);
                o[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a->sx[row * G + g]), o[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(acc + r * COLS, o[r]);
}

/* Which path ISA_AMX takes for a pass of m rows (measured on a 2-core Xeon with AMX, where a group's tile
 * product and the store of its sums cost ~10 ns whatever the rows, and the store holds up the vector work
 * beside it): 1-5 rows on the VNNI path; 6-8 rows on one int8 tile product a group; 9 rows (a block of 8
 * drafts and its anchor) on one int8 tile product for 8 of them and the VNNI units for the 9th, reading the
 * same unpacked weights; 10-16 rows of 4-bit weights on the bf16 tiles (two products a group, and no second tile store),
 * the rest on two int8 products. With 8-bit activations the VNNI path issues one product per 4 weights and
 * row, half of what 16-bit ones take, and keeps up to 9 rows in registers: it stays faster than the tile
 * up to there, and 10-16 rows take one tile product a group. */
#ifndef AMX_MIN_ROWS
#define AMX_MIN_ROWS 6
#endif
#ifndef AMX_A8_MIN_ROWS
#define AMX_A8_MIN_ROWS 10
#endif
#ifndef AMX_BF16_ROWS
#define AMX_BF16_ROWS 10
#endif
#ifndef AMX_HYBRID_ROWS
#define AMX_HYBRID_ROWS 9
#endif

#define TILE_AMX_CASE(R) case R: tile_amx(w, sc, bits, G, K, a, r0 + r, acc + r * COLS, R, 0); break;
#define TILE_AMX_BF16_CASE(R) case R: tile_amx_bf16(w, sc, G, a, r0 + r, acc + r * COLS, R); break;
#define TILE_AMX_A8_CASE(R) case R: tile_amx_a8(w, sc, bits, G, a, r0 + r, acc + r * COLS, R); break;

/* rows r0..r0+n-1 over one block, in passes of up to AMX_ROWS rows, each on the path `isa` picks for it */
__attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vnni,fma,amx-tile,amx-int8,amx-bf16")))
static void block_amx(const uint8_t *w, const uint16_t *sc, int bits, int G, int K, const Acts *a, int r0, int n,
                      float *acc, int isa, int *configured) {
    for (int r = 0; r < n; r += AMX_ROWS) {
        int m = n - r < AMX_ROWS ? n - r : AMX_ROWS;
        int bf16 = isa == ISA_AMX_BF16 || (isa == ISA_AMX && m >= AMX_BF16_ROWS);
        if (bits != 4 || a->ab == NULL) bf16 = 0;
        if (isa == ISA_AMX && m < (a->act8 ? AMX_A8_MIN_ROWS : AMX_MIN_ROWS)) {
            block_avx512(w, sc, bits, G, a, r0 + r, m, acc + r * COLS);
            continue;
        }
        if (a->act8) {                                 /* every tile layout: one product a group for m rows */
            amx_configure(m, LAYOUT_A8, configured);
            switch (m) {
                TILE_AMX_A8_CASE(1) TILE_AMX_A8_CASE(2) TILE_AMX_A8_CASE(3) TILE_AMX_A8_CASE(4)
                TILE_AMX_A8_CASE(5) TILE_AMX_A8_CASE(6) TILE_AMX_A8_CASE(7) TILE_AMX_A8_CASE(8)
                TILE_AMX_A8_CASE(9) TILE_AMX_A8_CASE(10) TILE_AMX_A8_CASE(11) TILE_AMX_A8_CASE(12)
                TILE_AMX_A8_CASE(13) TILE_AMX_A8_CASE(14) TILE_AMX_A8_CASE(15) TILE_AMX_A8_CASE(16)
            }
            continue;
        }
        if (isa == ISA_AMX && m == AMX_HYBRID_ROWS) {  /* 8 rows on one tile, the 9th on the vector units */
            amx_configure(8, LAYOUT_INT8, configured);
            tile_amx(w, sc, bits, G, K, a, r0 + r, acc + r * COLS, 8, 1);
            continue;
        }
        amx_configure(m, bf16 ? LAYOUT_BF16 : LAYOUT_INT8, configured);
        if (bf16)
            switch (m) {
                TILE_AMX_BF16_CASE(1) TILE_AMX_BF16_CASE(2) TILE_AMX_BF16_CASE(3) TILE_AMX_BF16_CASE(4)
                TILE_AMX_BF16_CASE(5) TILE_AMX_BF16_CASE(6) TILE_AMX_BF16_CASE(7) TILE_AMX_BF16_CASE(8)
                TILE_AMX_BF16_CASE(9) TILE_AMX_BF16_CASE(10) TILE_AMX_BF16_CASE(11) TILE_AMX_BF16_CASE(12)
                TILE_AMX_BF16_CASE(13) TILE_AMX_BF16_CASE(14) TILE_AMX_BF16_CASE(15) TILE_AMX_BF16_CASE(16)
            }
        else
            switch (m) {
                TILE_AMX_CASE(1) TILE_AMX_CASE(2) TILE_AMX_CASE(3) TILE_AMX_CASE(4) TILE_AMX_CASE(5)
                TILE_AMX_CASE(6) TILE_AMX_CASE(7) TILE_AMX_CASE(8) TILE_AMX_CASE(9) TILE_AMX_CASE(10)
                TILE_AMX_CASE(11) TILE_AMX_CASE(12) TILE_AMX_CASE(13) TILE_AMX_CASE(14) TILE_AMX_CASE(15)
                TILE_AMX_CASE(16)
            }
    }
}
#endif

/* out [rows, N] (bf16) = x [rows, K] (bf16) times the packed weight, plus residual [rows, N] where it is
 * not NULL (added to the bf16 product and rounded again, as a bf16 `residual + product` does);
 * N % 16 == 0, K % 32 == 0; act_bits: 16, or 8 for 8-bit activations. Returns 0, or -1 if scratch memory
 * could not be had. */
int bd_qgemm(const uint16_t *x, int rows, int K, const uint8_t *w, const uint16_t *scales, int N, int bits,
             int act_bits, uint16_t *out, const uint16_t *residual, int isa, int threads) {
    int G = K / GROUP, blocks = N / COLS;
    Acts a;
    a.half = (size_t)K + 64;     /* not a power of two: a tile's rows do not all fall in one cache set */
    a.hi = malloc((size_t)rows * 2 * a.half);
    a.lo = a.hi + a.half;
    a.dx = malloc(sizeof(float) * (size_t)rows * G);
    a.sx = malloc(sizeof(float) * (size_t)rows * G);
    a.sumhi = malloc(sizeof(int32_t) * (size_t)rows * G);
    a.sumlo = malloc(sizeof(int32_t) * (size_t)rows * G);
    if (!a.hi || !a.dx || !a.sx || !a.sumhi || !a.sumlo) {
        free(a.hi); free(a.dx); free(a.sx); free(a.sumhi); free(a.sumlo);
        return -1;
    }
    a.act8 = act_bits == 8;
    int tiles = isa >= ISA_AMX;
    if (tiles && !amx_granted()) isa = ISA_AVX512VNNI, tiles = 0;      /* the same bits without tiles */
    if (isa == ISA_PORTABLE) quantize_rows(x, rows, K, &a);
    else quantize_rows_avx2(x, rows, K, &a);
    a.ab = NULL;
#ifdef BD_AMX
    if (tiles && bits == 4 && !a.act8 && (isa == ISA_AMX_BF16 || rows >= AMX_BF16_ROWS)) {
        a.bhalf = (size_t)K + 32;
        a.ab = malloc(sizeof(uint16_t) * (size_t)rows * 2 * a.bhalf);
        if (a.ab) acts_bf16(&a, rows, K);             /* without them, the int8 tiles: the same bits */
    }
#endif
    size_t wblock = (size_t)G * (bits == 4 ? 256 : 512), sblock = (size_t)G * (bits == 4 ? 32 : 16);
#pragma omp parallel num_threads(threads)
    {
        int configured = 0;          /* the AMX tiles' row count in this thread (0: not configured) */
#pragma omp for schedule(static)
        for (int b = 0; b < blocks; b++) {
            float acc[ROWS * COLS];
            for (int r0 = 0; r0 < rows; r0 += ROWS) {
                int n = rows - r0 < ROWS ? rows - r0 : ROWS;
                memset(acc, 0, sizeof(float) * n * COLS);
                const uint8_t *wb = w + b * wblock;
                const uint16_t *sb = scales + b * sblock;
#ifdef BD_AMX
                if (tiles) block_amx(wb, sb, bits, G, K, &a, r0, n, acc, isa, &configured);
                else
#endif
                if (isa >= ISA_AVX512VNNI) block_avx512(wb, sb, bits, G, &a, r0, n, acc);
                else if (isa == ISA_AVX2) block_avx2(wb, sb, bits, G, &a, r0, n, acc);
                else block_portable(wb, sb, bits, G, K, &a, r0, n, acc);
                for (int r = 0; r < n; r++)
                    for (int c = 0; c < COLS; c++) {
                        size_t at = (size_t)(r0 + r) * N + b * COLS + c;
                        uint16_t y = f32_to_bf16(acc[r * COLS + c]);
                        out[at] = residual ? f32_to_bf16(bf16_to_f32(residual[at]) + bf16_to_f32(y)) : y;
                    }
            }
        }
#ifdef BD_AMX
        amx_release(&configured);
#endif
    }
    free(a.hi); free(a.ab); free(a.dx); free(a.sx); free(a.sumhi); free(a.sumlo);
    return 0;
}

/* ---- attention for inference on the CPU: softmax(q k^T * scale) v over the keys each query row sees ----
 * Per query row: scores in fp32 (16 partial sums over the head dimension, combined in a fixed tree),
 * the maximum, p = exp((score - max) * scale), the denominator, and sum p * v accumulated key by key
 * in key order. Masked keys are never read, and every row is computed on its own by the same
 * operations: its bits do not depend on the other rows, the batch, or how many masked keys follow
 * (nor on the instruction set: the portable, AVX2 and AVX512 spellings give the same bits). The AVX2
 * spelling takes one query row at a time; the AVX512 one takes the rows of a pass together, reading each
 * key once for all of them (`attend_rows`). */

#define LANES 16

/* One query row against the keys it sees -> out [d] bf16, in two spellings with the same arithmetic:
 * score = 16 lanes of fma over the head dimension, lanes folded l += l + w for w = 8, 4, 2, 1; then
 * p = exp_own((score - peak) * scale) rounded to bf16 per visible key, denom = their 16-lane sum folded
 * the same way, and acc = fma(p, v, acc) key by key in key order. */

static float fold16(float part[LANES]) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) part[l] += part[l + w];
    return part[0];
}

/* exp(x): 0 below -87 (and for NaN), inf above 88.7, else cephes' degree-6 polynomial on
 * x - n ln2 times 2^n, every step a separately rounded op or an fma, so the scalar and vector
 * spellings below give the same bits. The softmax weights take it at x <= 0, SiLU at any x. */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f
#define EXP_C2 (-2.12194440e-4f)
#define EXP_ROUND 12582912.0f                       /* 1.5 * 2^23: adding it rounds to an integer */
static const float EXP_P[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                               1.6666665459e-1f, 5.0000001201e-1f};

static float exp_own(float x) {
    if (!(x >= -87.0f)) return 0.0f;
    x = x < 89.0f ? x : 89.0f;                      /* n = 128 there: 2^n is inf */
    float n = (x * EXP_LOG2E + EXP_ROUND) - EXP_ROUND;
    float r = fmaf(n, -EXP_C2, fmaf(n, -EXP_C1, x));
    float p = EXP_P[0];
    for (int i = 1; i < 6; i++) p = fmaf(p, r, EXP_P[i]);
    float y = fmaf(p, r * r, r) + 1.0f;
    uint32_t u = (uint32_t)((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &u, 4);
    return y * two_n;
}

__attribute__((target("avx2,fma")))
static __m256 exp8(__m256 x) {
    __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(89.0f));
    __m256 rnd = _mm256_set1_ps(EXP_ROUND);
    __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)), rnd), rnd);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_C1), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_C2), r);
    __m256 p = _mm256_set1_ps(EXP_P[0]);
    for (int i = 1; i < 6; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P[i]));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), ok);
}

__attribute__((target("avx2,fma")))
static __m256 round8_bf16(__m256 x) {              /* to the nearest bf16, ties to even; NaN as f32_to_bf16 */
    __m256i u = _mm256_castps_si256(x);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)),
                           _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

__attribute__((target("avx2,fma")))
static inline void store8_bf16(uint16_t *p, __m256 x) {     /* x rounded to bf16, stored as 8 bf16 */
    __m256i y = _mm256_srli_epi32(_mm256_castps_si256(round8_bf16(x)), 16);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1)));
}

/* scores[0..n) (visible keys, in key order) -> p = exp((score - peak) * scale) rounded to bf16 (the weights
 * SDPA and HF's eager attention multiply the values by); *denom = their sum in 16 lanes (key i in lane
 * i % 16), folded. */
static void exps(float *scores, int n, float peak, float scale, float *denom) {
    float lanes[LANES] = {0};
    for (int i = 0; i < n; i++) {
        scores[i] = peak > -INFINITY ? bf16_to_f32(f32_to_bf16(exp_own((scores[i] - peak) * scale))) : 0.0f;
        lanes[i % LANES] += scores[i];
    }
    *denom = fold16(lanes);
}

__attribute__((target("avx2,fma")))
static inline float fold8(__m256 s8) {                 /* lanes 0..7 after the w = 8 fold */
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

/* exps in AVX2, the same bits, 16 keys at a time: scores has room for n rounded up to 16, and the keys past n
 * are padded to p = 0 (adding +0 to a lane's sum leaves it). */
__attribute__((target("avx2,fma")))
static void exps_avx2(float *scores, int n, float peak, float scale, float *denom) {
    int padded = (n + LANES - 1) & ~(LANES - 1);
    if (!(peak > -INFINITY)) {
        for (int i = 0; i < padded; i++) scores[i] = 0.0f;
        *denom = 0.0f;
        return;
    }
    for (int i = n; i < padded; i++) scores[i] = -INFINITY;
    __m256 pk = _mm256_set1_ps(peak), sc = _mm256_set1_ps(scale), lo = _mm256_setzero_ps(), hi = lo;
    for (int i = 0; i < padded; i += LANES) {
        __m256 a = round8_bf16(exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(scores + i), pk), sc)));
        __m256 b = round8_bf16(exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(scores + i + 8), pk), sc)));
        _mm256_storeu_ps(scores + i, a);
        _mm256_storeu_ps(scores + i + 8, b);
        lo = _mm256_add_ps(lo, a);
        hi = _mm256_add_ps(hi, b);
    }
    *denom = fold8(_mm256_add_ps(lo, hi));
}

/* One query head over its n visible keys, at element offsets koff / voff from kb / vb, in key order. */
static void row_portable(const float *qv, const uint16_t *kb, const uint16_t *vb, const int64_t *koff,
                         const int64_t *voff, int n, int d, float scale, float *scores, float *acc) {
    float peak = -INFINITY, denom = 0.0f;
    for (int i = 0; i < n; i++) {
        float part[LANES] = {0};
        for (int t = 0; t < d; t += LANES)
            for (int l = 0; l < LANES; l++) part[l] = fmaf(qv[t + l], bf16_to_f32(kb[koff[i] + t + l]), part[l]);
        scores[i] = fold16(part);
        peak = scores[i] > peak ? scores[i] : peak;
    }
    exps(scores, n, peak, scale, &denom);
    for (int i = 0; i < n; i++)
        for (int x = 0; x < d; x++) acc[x] = fmaf(scores[i], bf16_to_f32(vb[voff[i] + x]), acc[x]);
    acc[d] = denom;
}

/* fold8 of four vectors at once, the same additions: lanes 0, 4, 1, 5 of the result are s0..s3's sums */
__attribute__((target("avx2,fma")))
static inline __m256 fold8x4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    __m256 u01 = _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
    __m256 u23 = _mm256_add_ps(_mm256_permute2f128_ps(s2, s3, 0x20), _mm256_permute2f128_ps(s2, s3, 0x31));
    __m256 w = _mm256_add_ps(_mm256_shuffle_ps(u01, u23, _MM_SHUFFLE(1, 0, 1, 0)),     /* l + (l + 2) */
                             _mm256_shuffle_ps(u01, u23, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_shuffle_ps(w, w, _MM_SHUFFLE(2, 0, 2, 0)),              /* 0 + 1 */
                         _mm256_shuffle_ps(w, w, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* row_portable for the G query heads of one KV head at one query row (qv [G][d] fp32), in AVX2: each
 * visible key (offsets koff[0..n), in order) and value is converted from bf16 once for all G heads, and every
 * head runs row_portable's arithmetic in its order (the same bits: the score's 16 lanes are a's 8 and
 * b's 8, folded as fold16 does). scores [G][n rounded up to 16] scratch; acc [G][d + 1]. */
__attribute__((target("avx2,fma")))
static void group_avx2(const float *qv, int G, const uint16_t *kb, const uint16_t *vb, const int64_t *koff,
                       const int64_t *voff, int n, int d, float scale, float *scores, float *acc) {
    float conv[4][256] __attribute__((aligned(32))), peak[G], four[8];
    int stride = (n + LANES - 1) & ~(LANES - 1);     /* scores [G][stride]: room for exps_avx2's padding */
    memset(conv, 0, sizeof conv);
    for (int g = 0; g < G; g++) peak[g] = -INFINITY;
    for (int i0 = 0; i0 < n; i0 += 4) {            /* 4 keys at a time: independent fma chains */
        int m = n - i0 < 4 ? n - i0 : 4;
        for (int u = 0; u < m; u++) {
            const uint16_t *kr = kb + koff[i0 + u];
            for (int t = 0; t < d; t += 8) _mm256_store_ps(conv[u] + t, load8_bf16(kr + t));
        }
        for (int g = 0; g < G; g++) {
            const float *qg = qv + g * d;
            __m256 a[4], b[4];
            for (int u = 0; u < 4; u++) a[u] = b[u] = _mm256_setzero_ps();
            for (int t = 0; t < d; t += LANES) {
                __m256 qa = _mm256_loadu_ps(qg + t), qb = _mm256_loadu_ps(qg + t + 8);
                for (int u = 0; u < 4; u++) {
                    a[u] = _mm256_fmadd_ps(qa, _mm256_load_ps(conv[u] + t), a[u]);
                    b[u] = _mm256_fmadd_ps(qb, _mm256_load_ps(conv[u] + t + 8), b[u]);
                }
            }
            _mm256_storeu_ps(four, fold8x4(_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1]),
                                           _mm256_add_ps(a[2], b[2]), _mm256_add_ps(a[3], b[3])));
            for (int u = 0; u < m; u++) {
                float sc = four[(u & 1) * 4 + (u >> 1)];    /* keys 0, 2 in lanes 0, 1; keys 1, 3 in 4, 5 */
                scores[g * stride + i0 + u] = sc;
                peak[g] = sc > peak[g] ? sc : peak[g];
            }
        }
    }
    for (int g = 0; g < G; g++) exps_avx2(scores + g * stride, n, peak[g], scale, acc + g * (d + 1) + d);
    for (int x = 0; x < d; x += 32) {              /* per head 4 accumulators, keys in order */
        int w = d - x < 32 ? d - x : 32;
        for (int g0 = 0; g0 < G; g0 += 3) {        /* 3 heads' 12 accumulators in registers */
            int gn = G - g0 < 3 ? G - g0 : 3;
            __m256 a[3][4];
            for (int g = 0; g < 3; g++)
                for (int c = 0; c < 4; c++) a[g][c] = _mm256_setzero_ps();
            for (int i = 0; i < n; i++) {
                const uint16_t *vr = vb + voff[i] + x;
                __m256 vv[4];
                for (int c = 0; c < 4; c++) vv[c] = c * 8 < w ? load8_bf16(vr + 8 * c) : _mm256_setzero_ps();
                for (int g = 0; g < gn; g++) {
                    __m256 pv = _mm256_set1_ps(scores[(g0 + g) * stride + i]);
                    for (int c = 0; c < 4; c++) a[g][c] = _mm256_fmadd_ps(pv, vv[c], a[g][c]);
                }
            }
            for (int g = 0; g < gn; g++)
                for (int c = 0; c * 8 < w; c++) _mm256_storeu_ps(acc + (g0 + g) * (d + 1) + x + 8 * c, a[g][c]);
        }
    }
}

/* group_avx2 for R query rows of one KV head at once, in 16-lane AVX512: each key's K and V are read and
 * converted from bf16 once for every row and query head that sees it, instead of once per row (a verify
 * pass's rows share their context). Per row and head the arithmetic and its order are group_avx2's, so
 * the bits are too: a score's 16 lanes run t = l, l + 16, ... from zero and fold as fold16 (lanes
 * l + (l + 8) first, as group_avx2's a + b, then fold8x4); the row's visible scores keep key order for
 * its peak and exps_avx2; its values accumulate key by key in key order, keys it does not see skipped.
 * qv [R][G][d] fp32; the union of the keys any row sees at offsets koff / voff [nu] in key order, and
 * seen [R][nu] whether row r sees union key u; scores [R * G][stride] scratch (stride >= nu rounded up to
 * 16); acc [R * G][d + 1]. */
#define PAIRS_PER_PASS 6                        /* (row, head) pairs whose 4 value vectors stay in registers */
#define VALUE_TILE 128                          /* keys whose values (fp32, 64 lanes: 32 KiB) stay in L1 */

__attribute__((target("avx512f,avx512bw,avx2,fma")))
static inline __m512 load16_bf16(const uint16_t *p) {          /* bf16_to_f32 of 16 values */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

__attribute__((target("avx512f,avx512bw,avx2,fma")))
static inline __m256 fold16to8(__m512 s) {                     /* lanes l + (l + 8) */
    return _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
}

/* exp8, round8_bf16 and exps_avx2 in 16 lanes: the same operations lane by lane, so the same bits (the
 * denominator's lanes 0-7 and 8-15 are exps_avx2's lo and hi sums, folded as it folds them). */
__attribute__((target("avx512f,avx512bw,avx2,fma")))
static __m512 exp16(__m512 x) {
    __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(89.0f));
    __m512 rnd = _mm512_set1_ps(EXP_ROUND);
    __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)), rnd), rnd);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_C1), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_C2), r);
    __m512 p = _mm512_set1_ps(EXP_P[0]);
    for (int i = 1; i < 6; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P[i]));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(ok, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}

__attribute__((target("avx512f,avx512bw,avx2,fma")))
static __m512 round16_bf16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

__attribute__((target("avx512f,avx512bw,avx2,fma")))
static inline void store16_bf16(uint16_t *p, __m512 x) {     /* x rounded to bf16, stored as 16 bf16 */
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(round16_bf16(x)), 16)));
}

__attribute__((target("avx512f,avx512bw,avx2,fma")))
static void exps_avx512(float *scores, int n, float peak, float scale, float *denom) {
    int padded = (n + LANES - 1) & ~(LANES - 1);
    if (!(peak > -INFINITY)) {
        for (int i = 0; i < padded; i++) scores[i] = 0.0f;
        *denom = 0.0f;
        return;
    }
    for (int i = n; i < padded; i++) scores[i] = -INFINITY;
    __m512 pk = _mm512_set1_ps(peak), sc = _mm512_set1_ps(scale), sum = _mm512_setzero_ps();
    for (int i = 0; i < padded; i += LANES) {
        __m512 a = round16_bf16(exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(scores + i), pk), sc)));
        _mm512_storeu_ps(scores + i, a);
        sum = _mm512_add_ps(sum, a);
    }
    *denom = fold8(fold16to8(sum));
}

__attribute__((target("avx512f,avx512bw,avx2,fma")))
static void rows_avx512(const float *qv, int R, int G, const uint16_t *kb, const uint16_t *vb, const int64_t *koff,
                        const int64_t *voff, const uint8_t *seen, int nu, int d, float scale, float *scores,
                        int stride, float *acc) {
    int P = R * G;                              /* pair p = (row p / G, head p % G) */
    static __thread float vt[VALUE_TILE * 64] __attribute__((aligned(64)));
    float conv[4][256] __attribute__((aligned(64))), four[8];
    for (int u0 = 0; u0 < nu; u0 += 4) {        /* every pair's score at every union key, 4 keys at a time */
        int m = nu - u0 < 4 ? nu - u0 : 4;
        for (int u = 0; u < 4; u++)             /* past the last key: zeros, whose scores are dropped */
            for (int t = 0; t < d; t += 16)
                _mm512_store_ps(conv[u] + t, u < m ? load16_bf16(kb + koff[u0 + u] + t) : _mm512_setzero_ps());
        for (int p = 0; p < P; p++) {
            const float *qp = qv + (size_t)p * d;
            __m512 s[4];
            for (int u = 0; u < 4; u++) s[u] = _mm512_setzero_ps();
            for (int t = 0; t < d; t += 16) {
                __m512 qq = _mm512_loadu_ps(qp + t);
                for (int u = 0; u < 4; u++) s[u] = _mm512_fmadd_ps(qq, _mm512_load_ps(conv[u] + t), s[u]);
            }
            _mm256_storeu_ps(four, fold8x4(fold16to8(s[0]), fold16to8(s[1]), fold16to8(s[2]), fold16to8(s[3])));
            for (int u = 0; u < m; u++) scores[(size_t)p * stride + u0 + u] = four[(u & 1) * 4 + (u >> 1)];
        }
    }
    int prefix[R];                              /* row r sees every union key before prefix[r] */
    for (int r = 0; r < R; r++) {
        const uint8_t *sees = seen + (size_t)r * nu;
        prefix[r] = 0;
        while (prefix[r] < nu && sees[prefix[r]]) prefix[r]++;
    }
    for (int p = 0; p < P; p++) {               /* each pair's visible scores, in key order -> p, denominator */
        const uint8_t *sees = seen + (size_t)(p / G) * nu;
        float *sc = scores + (size_t)p * stride;
        int all = prefix[p / G];                /* their scores stay where they are */
        __m512 top = _mm512_set1_ps(-INFINITY);
        int u = 0;
        for (; u + 16 <= all; u += 16) top = _mm512_max_ps(_mm512_loadu_ps(sc + u), top);   /* NaN: keeps top */
        float peak = _mm512_reduce_max_ps(top);   /* a maximum, whatever the order (a zero's sign never matters) */
        for (; u < all; u++) peak = sc[u] > peak ? sc[u] : peak;
        int n = all;
        for (u = all; u < nu; u++)
            if (sees[u]) {
                float v = sc[u];
                sc[n++] = v;
                peak = v > peak ? v : peak;
            }
        exps_avx512(sc, n, peak, scale, acc + (size_t)p * (d + 1) + d);
    }
    /* values, a tile of keys at a time (converted once into vt, then read from L1 by every pair); per pair 4
     * accumulators over 64 of the d lanes, carried in acc from tile to tile: each lane still sums its keys in
     * key order */
    int cursor[P];                              /* each pair's next weight in its compacted scores */
    for (int x = 0; x < d; x += 64) {
        int w = d - x < 64 ? d - x : 64;
        for (int p = 0; p < P; p++) cursor[p] = 0;
        for (int u0 = 0; u0 < nu; u0 += VALUE_TILE) {
            int un = nu - u0 < VALUE_TILE ? nu - u0 : VALUE_TILE;
            for (int u = 0; u < un; u++)
                for (int c = 0; c * 16 < w; c++)
                    _mm512_store_ps(vt + u * 64 + 16 * c, load16_bf16(vb + voff[u0 + u] + x + 16 * c));
            for (int p0 = 0; p0 < P; p0 += PAIRS_PER_PASS) {
                int pn = P - p0 < PAIRS_PER_PASS ? P - p0 : PAIRS_PER_PASS;
                const float *next[PAIRS_PER_PASS];
                const uint8_t *sees[PAIRS_PER_PASS];
                __m512 a[PAIRS_PER_PASS][4];
                for (int j = 0; j < PAIRS_PER_PASS; j++) {
                    int p = p0 + (j < pn ? j : 0);
                    next[j] = scores + (size_t)p * stride + cursor[p];
                    sees[j] = seen + (size_t)(p / G) * nu + u0;
                    for (int c = 0; c < 4; c++)
                        a[j][c] = c * 16 < w ? _mm512_loadu_ps(acc + (size_t)p * (d + 1) + x + 16 * c) : _mm512_setzero_ps();
                }
                /* keys [0, plain) of the tile every pair of the pass sees run without the per-key test (one loop
                 * testing `u < plain` measured ~6% slower at 9 rows, 8151 keys) */
                int plain = un;
                for (int j = 0; j < pn; j++) {
                    int seen_all = prefix[(p0 + j) / G] - u0;
                    plain = seen_all < plain ? seen_all : plain;
                }
                for (int u = 0; u < plain; u++) {
                    const float *vr = vt + u * 64;
#pragma GCC unroll 6
                    for (int j = 0; j < PAIRS_PER_PASS; j++)
                        if (j < pn) {
                            __m512 pv = _mm512_set1_ps(*next[j]++);
                            for (int c = 0; c < 4; c++)
                                if (c * 16 < w) a[j][c] = _mm512_fmadd_ps(pv, _mm512_load_ps(vr + 16 * c), a[j][c]);
                        }
                }
                for (int u = plain > 0 ? plain : 0; u < un; u++) {
                    const float *vr = vt + u * 64;
#pragma GCC unroll 6
                    for (int j = 0; j < PAIRS_PER_PASS; j++)
                        if (j < pn && sees[j][u]) {
                            __m512 pv = _mm512_set1_ps(*next[j]++);
                            for (int c = 0; c < 4; c++)
                                if (c * 16 < w) a[j][c] = _mm512_fmadd_ps(pv, _mm512_load_ps(vr + 16 * c), a[j][c]);
                        }
                }
                for (int j = 0; j < pn; j++) {
                    int p = p0 + j;
                    cursor[p] = (int)(next[j] - (scores + (size_t)p * stride));
                    for (int c = 0; c * 16 < w; c++) _mm512_storeu_ps(acc + (size_t)p * (d + 1) + x + 16 * c, a[j][c]);
                }
            }
        }
    }
}

/* Where attention reads K and V: element strides (batch, kv head, key) of each, or, where `slots` is
 * given, a slot per (batch, key) [b, tk] and strides (unused, kv head, slot) shared by K and V (a
 * paged pool or a cache read in place). */
typedef struct {
    const uint16_t *k, *v;
    const int64_t *kst, *vst, *slots;
} KvRead;

/* Key j of batch row bi: where its K and V start (koff / voff, in elements from kv.k / kv.v). */
static inline void key_at(KvRead kv, int bi, int tk, int j, int64_t *koff, int64_t *voff) {
    if (kv.slots) {
        int64_t slot = kv.slots[(int64_t)bi * tk + j];
        *koff = slot * kv.kst[2];
        *voff = slot * kv.vst[2];
    } else {
        *koff = bi * kv.kst[0] + j * kv.kst[2];
        *voff = bi * kv.vst[0] + j * kv.vst[2];
    }
}

/* The G query heads of KV head kvh at query row i of batch row bi, from q [b, h, tq, d] -> qv [G][d] fp32. */
static void load_queries(const uint16_t *q, int bi, int h, int tq, int d, int kvh, int G, int i, float *qv) {
    for (int g = 0; g < G; g++) {
        const uint16_t *qr = q + (((size_t)bi * h + kvh * G + g) * tq + i) * d;
        for (int x = 0; x < d; x++) qv[g * d + x] = bf16_to_f32(qr[x]);
    }
}

/* Those heads' accumulators acc [G][d + 1] (sum p v, then the denominator) -> out [b, tq, h * d] bf16; a head
 * that saw no key gives zeros. */
static void store_heads(const float *acc, int bi, int h, int tq, int d, int kvh, int G, int i, uint16_t *out) {
    for (int g = 0; g < G; g++) {
        const float *ag = acc + g * (d + 1);
        uint16_t *o = out + ((size_t)bi * tq + i) * h * d + (size_t)(kvh * G + g) * d;
        for (int x = 0; x < d; x++) o[x] = f32_to_bf16(ag[d] > 0.0f ? ag[x] / ag[d] : 0.0f);
    }
}

/* q [b, h, tq, d] contiguous bf16 over the keys `kv` gives; vis uint8 with strides (batch, query row,
 * key), or NULL (all visible); out [b, tq, h * d] bf16. d % 16 == 0, d <= 256. Returns 0, -1 without
 * scratch memory, -2 for d > 256. */
static int attend_rows(const uint16_t *q, int b, int h, int tq, int d, KvRead kv, int hkv, int tk,
                       const uint8_t *vis, const int64_t *vis_strides, float scale, uint16_t *out, int threads);

static int attend(const uint16_t *q, int b, int h, int tq, int d, KvRead kv, int hkv, int tk, const uint8_t *vis,
                  const int64_t *vis_strides, float scale, uint16_t *out, int isa, int threads) {
    int groups = h / hkv, failed = 0;
    if (d > 256 || d % LANES) return -2;
    if (isa >= ISA_AVX512VNNI) return attend_rows(q, b, h, tq, d, kv, hkv, tk, vis, vis_strides, scale, out, threads);
#pragma omp parallel num_threads(threads)
    {
        /* per thread: the scores of a group [groups][tk rounded up to 16], the visible keys' K and V offsets [tk] each,
         * the accumulators [groups][d + 1] and the queries in fp32 [groups][d] */
        size_t keys = tk > 0 ? (size_t)tk : 1;
        size_t padded = (keys + LANES - 1) & ~(size_t)(LANES - 1);
        float *scores = malloc(sizeof(float) * padded * groups), *acc = malloc(sizeof(float) * groups * (d + 1));
        int64_t *koff = malloc(sizeof(int64_t) * 2 * keys), *voff = koff + keys;
        float *qv = malloc(sizeof(float) * groups * d);
        int ok = scores && acc && koff && qv;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int unit = 0; unit < b * hkv * tq; unit++) {          /* (batch, KV head, query row) */
            if (!ok) continue;
            int bi = unit / (hkv * tq), kvh = unit / tq % hkv, i = unit % tq;
            const uint8_t *seen = vis ? vis + bi * vis_strides[0] + i * vis_strides[1] : NULL;
            int64_t st = vis ? vis_strides[2] : 0;
            int n = 0;
            for (int j = 0; j < tk; j++)
                if (!seen || seen[j * st]) {
                    key_at(kv, bi, tk, j, koff + n, voff + n);
                    n++;
                }
            const uint16_t *kb = kv.k + kvh * kv.kst[1], *vb = kv.v + kvh * kv.vst[1];
            memset(acc, 0, sizeof(float) * groups * (d + 1));
            load_queries(q, bi, h, tq, d, kvh, groups, i, qv);
            if (isa != ISA_PORTABLE)
                group_avx2(qv, groups, kb, vb, koff, voff, n, d, scale, scores, acc);
            else
                for (int g = 0; g < groups; g++)
                    row_portable(qv + g * d, kb, vb, koff, voff, n, d, scale, scores, acc + g * (d + 1));
            store_heads(acc, bi, h, tq, d, kvh, groups, i, out);
        }
        free(scores); free(acc); free(koff); free(qv);
    }
    return failed ? -1 : 0;
}

/* `attend` on AVX512 machines: a work unit is (batch, KV head, a run of query rows), the rows of a run
 * together in rows_avx512 (K and V read once per run). Runs are as long as the thread count allows: whole
 * rows per unit where batch x KV heads already gives every thread two units, shorter where it does not,
 * and at most ROWS_PER_PASS query vectors (rows x heads per KV head) per run to bound the scratch. */
#define ROWS_PER_PASS 32

static int attend_rows(const uint16_t *q, int b, int h, int tq, int d, KvRead kv, int hkv, int tk,
                       const uint8_t *vis, const int64_t *vis_strides, float scale, uint16_t *out, int threads) {
    int groups = h / hkv, failed = 0;
    int runs = (2 * threads + b * hkv - 1) / (b * hkv);           /* runs per (batch, KV head) */
    int cap = ROWS_PER_PASS / groups > 0 ? ROWS_PER_PASS / groups : 1;
    int per = (tq + runs - 1) / runs;
    per = per < cap ? per : cap;
    per = per > 0 ? per : 1;
    runs = (tq + per - 1) / per;
#pragma omp parallel num_threads(threads)
    {
        size_t keys = tk > 0 ? (size_t)tk : 1;
        size_t stride = (keys + LANES - 1) & ~(size_t)(LANES - 1);
        float *scores = malloc(sizeof(float) * stride * per * groups);
        float *acc = malloc(sizeof(float) * per * groups * (d + 1)), *qv = malloc(sizeof(float) * per * groups * d);
        int64_t *koff = malloc(sizeof(int64_t) * 2 * keys), *voff = koff ? koff + keys : NULL;
        uint8_t *seen = malloc(keys * per);
        int ok = scores && acc && qv && koff && seen;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int unit = 0; unit < b * hkv * runs; unit++) {        /* (batch, KV head, run of rows) */
            if (!ok) continue;
            int bi = unit / (hkv * runs), kvh = unit / runs % hkv, r0 = unit % runs * per;
            int R = tq - r0 < per ? tq - r0 : per, nu = 0;
            int64_t st = vis ? vis_strides[2] : 0;
            for (int j = 0; j < tk; j++) {                          /* the keys any row of the run sees */
                int any = 0;
                for (int r = 0; r < R; r++) {
                    const uint8_t *row = vis ? vis + bi * vis_strides[0] + (int64_t)(r0 + r) * vis_strides[1] : NULL;
                    seen[(size_t)r * keys + nu] = row ? row[j * st] != 0 : 1;
                    any |= seen[(size_t)r * keys + nu];
                }
                if (any) {
                    key_at(kv, bi, tk, j, koff + nu, voff + nu);
                    nu++;
                }
            }
            if (nu < tk)                                             /* seen as [R][nu] */
                for (int r = 1; r < R; r++) memmove(seen + (size_t)r * nu, seen + (size_t)r * keys, nu);
            const uint16_t *kb = kv.k + kvh * kv.kst[1], *vb = kv.v + kvh * kv.vst[1];
            memset(acc, 0, sizeof(float) * R * groups * (d + 1));
            for (int r = 0; r < R; r++) load_queries(q, bi, h, tq, d, kvh, groups, r0 + r, qv + (size_t)r * groups * d);
            rows_avx512(qv, R, groups, kb, vb, koff, voff, seen, nu, d, scale, scores, (int)stride, acc);
            for (int r = 0; r < R; r++) store_heads(acc + (size_t)r * groups * (d + 1), bi, h, tq, d, kvh, groups, r0 + r, out);
        }
        free(scores); free(acc); free(qv); free(koff); free(seen);
    }
    return failed ? -1 : 0;
}

/* k, v bf16 with element strides (batch, kv head, key) kv_strides[0..3) and [3..6), the head dimension
 * contiguous; the rest as `attend`. */
int bd_attend(const uint16_t *q, int b, int h, int tq, int d, const uint16_t *k, const uint16_t *v,
              const int64_t *kv_strides, int hkv, int tk, const uint8_t *vis, const int64_t *vis_strides,
              float scale, uint16_t *out, int isa, int threads) {
    KvRead kv = {k, v, kv_strides, kv_strides + 3, NULL};
    return attend(q, b, h, tq, d, kv, hkv, tk, vis, vis_strides, scale, out, isa, threads);
}

/* ---- RMSNorm for inference on the CPU: out = w * bf16(x * 1/sqrt(mean(x^2) + eps)) ----
 * As Llama / Qwen3 define it (statistics in fp32, the weight applied after the cast back, the product
 * rounded to bf16); the sum of squares in 16 fp32 lanes of fma folded in a fixed tree, one row at a
 * time: its bits do not depend on the other rows (nor on the instruction set). x, w, out bf16; d % 16 == 0. */
static void rmsnorm_row(const uint16_t *xr, int d, const uint16_t *w, float eps, uint16_t *o) {
    float part[LANES] = {0};
    for (int t = 0; t < d; t += LANES)
        for (int l = 0; l < LANES; l++) {
            float v = bf16_to_f32(xr[t + l]);
            part[l] = fmaf(v, v, part[l]);
        }
    float inv = 1.0f / sqrtf(fold16(part) / (float)d + eps);
    for (int i = 0; i < d; i++) {
        float y = bf16_to_f32(f32_to_bf16(bf16_to_f32(xr[i]) * inv));
        o[i] = f32_to_bf16(bf16_to_f32(w[i]) * y);
    }
}

__attribute__((target("avx2,fma")))
static void rmsnorm_row_avx2(const uint16_t *xr, int d, const uint16_t *w, float eps, uint16_t *o) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();      /* part[0..8) and part[8..16) */
    for (int t = 0; t < d; t += LANES) {
        __m256 a = load8_bf16(xr + t), b = load8_bf16(xr + t + 8);
        lo = _mm256_fmadd_ps(a, a, lo);
        hi = _mm256_fmadd_ps(b, b, hi);
    }
    __m256 inv = _mm256_set1_ps(1.0f / sqrtf(fold8(_mm256_add_ps(lo, hi)) / (float)d + eps));
    for (int i = 0; i < d; i += 8) {
        __m256 y = round8_bf16(_mm256_mul_ps(load8_bf16(xr + i), inv));
        store8_bf16(o + i, _mm256_mul_ps(load8_bf16(w + i), y));
    }
}

/* rmsnorm_row_avx2 in 16 lanes: lane l's sum of squares is part[l] as there (its lo lanes 0-7, hi 8-15, folded
 * as it folds them), the rest lane by lane the same operations: the same bits */
__attribute__((target("avx512f,avx512bw,avx2,fma")))
static void rmsnorm_row_avx512(const uint16_t *xr, int d, const uint16_t *w, float eps, uint16_t *o) {
    __m512 sum = _mm512_setzero_ps();
    for (int t = 0; t < d; t += LANES) {
        __m512 a = load16_bf16(xr + t);
        sum = _mm512_fmadd_ps(a, a, sum);
    }
    __m512 inv = _mm512_set1_ps(1.0f / sqrtf(fold8(fold16to8(sum)) / (float)d + eps));
    for (int i = 0; i < d; i += LANES) {
        __m512 y = round16_bf16(_mm512_mul_ps(load16_bf16(xr + i), inv));
        store16_bf16(o + i, _mm512_mul_ps(load16_bf16(w + i), y));
    }
}

/* Elements below which the elementwise kernels stay on the calling thread (a fork costs more than they save) */
#define ELEMENTWISE_PARALLEL 16384

void bd_rmsnorm(const uint16_t *x, int rows, int d, const uint16_t *w, float eps, uint16_t *out, int isa, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if ((size_t)rows * d >= ELEMENTWISE_PARALLEL && threads > 1)
    for (int r = 0; r < rows; r++) {
        const uint16_t *xr = x + (size_t)r * d;
        uint16_t *o = out + (size_t)r * d;
        if (isa >= ISA_AVX512VNNI) rmsnorm_row_avx512(xr, d, w, eps, o);
        else if (isa != ISA_PORTABLE) rmsnorm_row_avx2(xr, d, w, eps, o);
        else rmsnorm_row(xr, d, w, eps, o);
    }
}

/* ---- SwiGLU for bf16 inference: act = bf16(bf16(silu(gate)) * up), silu(g) = g / (1 + exp(-g)) in fp32 ----
 * (exp_own; the rounding of PyTorch's spelling `F.silu(gate) * up` in bf16). Row by row, element by element:
 * the bits depend on nothing else. gate and up rows at element strides gs and us; act [rows, I]. */
static inline uint16_t swiglu1(uint16_t g, uint16_t u) {
    float x = bf16_to_f32(g);
    float s = bf16_to_f32(f32_to_bf16(x / (1.0f + exp_own(-x))));
    return f32_to_bf16(s * bf16_to_f32(u));
}

__attribute__((target("avx2,fma")))
static void swiglu_avx2(const uint16_t *g, const uint16_t *u, int n, uint16_t *act) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = load8_bf16(g + i);
        __m256 s = round8_bf16(_mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)))));
        store8_bf16(act + i, _mm256_mul_ps(s, load8_bf16(u + i)));
    }
    for (; i < n; i++) act[i] = swiglu1(g[i], u[i]);
}

/* swiglu_avx2 in 16 lanes (exp16, round16_bf16: the same operations lane by lane): the same bits */
__attribute__((target("avx512f,avx512bw,avx2,fma")))
static void swiglu_avx512(const uint16_t *g, const uint16_t *u, int n, uint16_t *act) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        __m512 x = load16_bf16(g + i);
        __m512 s = round16_bf16(_mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x)))));
        store16_bf16(act + i, _mm512_mul_ps(s, load16_bf16(u + i)));
    }
    for (; i < n; i++) act[i] = swiglu1(g[i], u[i]);
}

#define SWIGLU_CHUNK 2048    /* elements of a row per unit of work: a single row still splits between threads */

void bd_swiglu(const uint16_t *gate, int64_t gs, const uint16_t *up, int64_t us, int rows, int I, uint16_t *act,
               int isa, int threads) {
    int chunks = (I + SWIGLU_CHUNK - 1) / SWIGLU_CHUNK;
#pragma omp parallel for num_threads(threads) schedule(static) if ((size_t)rows * I >= ELEMENTWISE_PARALLEL && threads > 1)
    for (int unit = 0; unit < rows * chunks; unit++) {
        int r = unit / chunks, c0 = unit % chunks * SWIGLU_CHUNK, n = I - c0 < SWIGLU_CHUNK ? I - c0 : SWIGLU_CHUNK;
        const uint16_t *g = gate + r * gs + c0, *u = up + r * us + c0;
        uint16_t *a = act + (size_t)r * I + c0;
        if (isa >= ISA_AVX512VNNI) swiglu_avx512(g, u, n, a);
        else if (isa != ISA_PORTABLE) swiglu_avx2(g, u, n, a);
        else
            for (int i = 0; i < n; i++) a[i] = swiglu1(g[i], u[i]);
    }
}

/* ---- LFM2's short convolution for bf16 inference (models/lfm2.py's ShortConv between its projections) ----
 * From in_proj's rows [b, t, 3H] (B, C and x side by side, rows `row_stride` elements apart) and the state
 * [b, K-1, H] (the last K-1 rows of B*x before these): bx = bf16(B * x) [b, t, H] (the rows the state keeps)
 * and y = bf16(C * bf16(conv)) [b, t, H], where conv over the window [state; bx] is, per channel c, in fp32:
 * acc = win[0] * w[c, 0], then acc = acc + win[j] * w[c, j] for j = 1..K-1, then + bias[c] (bias may be
 * NULL) -- each product and sum rounded on its own, as the PyTorch spelling (deltanet.causal_conv) rounds
 * them: the same bits on every path. w [H, K] and bias [H] bf16. Returns 0, or -1 without scratch memory. */
static void short_conv_row(const uint16_t *pr, int H, const uint16_t *const *win, int K, const float *wt,
                           const uint16_t *bias, uint16_t *bxr, uint16_t *yr, int from) {
    for (int c = from; c < H; c++) bxr[c] = f32_to_bf16(bf16_to_f32(pr[c]) * bf16_to_f32(pr[2 * H + c]));
    for (int c = from; c < H; c++) {
        float acc = bf16_to_f32(win[0][c]) * wt[c];
        for (int j = 1; j < K; j++) acc = acc + bf16_to_f32(win[j][c]) * wt[(size_t)j * H + c];
        if (bias) acc = acc + bf16_to_f32(bias[c]);
        yr[c] = f32_to_bf16(bf16_to_f32(pr[H + c]) * bf16_to_f32(f32_to_bf16(acc)));
    }
}

/* short_conv_row 8 channels at a time: the same operations (no fma), so the same bits */
__attribute__((target("avx2,fma")))
static void short_conv_row_avx2(const uint16_t *pr, int H, const uint16_t *const *win, int K, const float *wt,
                                const uint16_t *bias, uint16_t *bxr, uint16_t *yr) {
    int c = 0;
    for (; c + 8 <= H; c += 8) store8_bf16(bxr + c, _mm256_mul_ps(load8_bf16(pr + c), load8_bf16(pr + 2 * H + c)));
    for (c = 0; c + 8 <= H; c += 8) {
        __m256 acc = _mm256_mul_ps(load8_bf16(win[0] + c), _mm256_loadu_ps(wt + c));
        for (int j = 1; j < K; j++)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(load8_bf16(win[j] + c), _mm256_loadu_ps(wt + (size_t)j * H + c)));
        if (bias) acc = _mm256_add_ps(acc, load8_bf16(bias + c));
        store8_bf16(yr + c, _mm256_mul_ps(load8_bf16(pr + H + c), round8_bf16(acc)));
    }
    short_conv_row(pr, H, win, K, wt, bias, bxr, yr, c);
}

int bd_short_conv(const uint16_t *proj, int64_t row_stride, const uint16_t *state, int b, int t, int H, int K,
                  const uint16_t *w, const uint16_t *bias, uint16_t *bx, uint16_t *y, int isa) {
    float *wt = malloc(sizeof(float) * (size_t)K * H);             /* [K, H]: tap j's weights side by side */
    const uint16_t **win = malloc(sizeof(uint16_t *) * (size_t)K);
    if (!wt || !win) {
        free(wt); free(win);
        return -1;
    }
    for (int c = 0; c < H; c++)
        for (int j = 0; j < K; j++) wt[(size_t)j * H + c] = bf16_to_f32(w[(size_t)c * K + j]);
    for (int bi = 0; bi < b; bi++)
        for (int i = 0; i < t; i++) {
            for (int j = 0; j < K; j++) {
                int m = i + j - (K - 1);                     /* the window's row i + j: a state row, or bx row m */
                win[j] = m < 0 ? state + ((size_t)bi * (K - 1) + (K - 1 + m)) * H : bx + ((size_t)bi * t + m) * H;
            }
            const uint16_t *pr = proj + ((size_t)bi * t + i) * row_stride;
            uint16_t *bxr = bx + ((size_t)bi * t + i) * H, *yr = y + ((size_t)bi * t + i) * H;
            if (isa != ISA_PORTABLE) short_conv_row_avx2(pr, H, win, K, wt, bias, bxr, yr);
            else short_conv_row(pr, H, win, K, wt, bias, bxr, yr, 0);
        }
    free(wt); free(win);
    return 0;
}

/* One LFM2 short-convolution layer with weight-only linear layers for bf16 inference (models/lfm2.py's
 * ShortConvLayer over these kernels, the same operations and roundings, in one call): x [b*t, H] in place
 * becomes x1 + down(swiglu(gate_up(norm2(x1)))) with x1 = x + out_proj(short_conv(in_proj(norm1(x)))), and bx
 * [b*t, H] receives the rows the conv state keeps (bd_short_conv). Returns 0, or < 0 as bd_qgemm. */
int bd_conv_layer(uint16_t *x, int b, int t, int H, int I, const uint16_t *norm1, const uint16_t *norm2, float eps,
                  const uint8_t *in_w, const uint16_t *in_s, const uint8_t *out_w, const uint16_t *out_s,
                  const uint8_t *gu_w, const uint16_t *gu_s, const uint8_t *down_w, const uint16_t *down_s, int bits,
                  int act_bits, const uint16_t *state, const uint16_t *conv_w, const uint16_t *conv_b, int K,
                  uint16_t *bx, int isa, int threads) {
    size_t rows = (size_t)b * t;
    uint16_t *scratch = malloc(2 * rows * ((size_t)H + 3 * (size_t)H + H + H + 3 * (size_t)I));
    if (!scratch) return -1;
    uint16_t *normed = scratch, *proj = normed + rows * H, *y = proj + rows * 3 * H, *x1 = y + rows * H,
             *gu = x1 + rows * H, *act = gu + rows * 2 * I;
    bd_rmsnorm(x, (int)rows, H, norm1, eps, normed, isa, threads);
    int rc = bd_qgemm(normed, (int)rows, H, in_w, in_s, 3 * H, bits, act_bits, proj, NULL, isa, threads);
    if (rc == 0) rc = bd_short_conv(proj, 3 * H, state, b, t, H, K, conv_w, conv_b, bx, y, isa);
    if (rc == 0) rc = bd_qgemm(y, (int)rows, H, out_w, out_s, H, bits, act_bits, x1, x, isa, threads);
    if (rc == 0) {
        bd_rmsnorm(x1, (int)rows, H, norm2, eps, normed, isa, threads);
        rc = bd_qgemm(normed, (int)rows, H, gu_w, gu_s, 2 * I, bits, act_bits, gu, NULL, isa, threads);
    }
    if (rc == 0) {
        bd_swiglu(gu, 2 * I, gu + I, 2 * I, (int)rows, I, act, isa, threads);
        rc = bd_qgemm(act, (int)rows, I, down_w, down_s, H, bits, act_bits, x, x1, isa, threads);
    }
    free(scratch);
    return rc;
}

/* ---- the quantized target's decoder layers in one call (models/target.py's fused path) ----
 * The operations, order and roundings of the layers' PyTorch spelling over these kernels — RMSNorm,
 * the projections, Qwen3's q/k norms, the NeoX rotation x*cos + roll(x, d/2)*sin with each op rounded
 * to bf16, the cache write, the attention, the residual adds in bf16, SwiGLU — so the same bits, with
 * no Python between the layers. */

/* Where a layer's new K and V rows go: row r (of b*t) to slot slots[r] (nowhere where < 0: a batch's
 * padding) at element offset slot * stride + kv head * head_stride of k and v. */
typedef struct {
    uint16_t *k, *v;
    const int64_t *slots;
    int64_t stride, head_stride;
} KvWrite;

/* The NeoX rotation of one head: dst = bf16(bf16(x * cos) + bf16(roll(x, d/2) * sin)), each product exact in
 * fp32 and rounded once, as PyTorch's bf16 ops round them; the two spellings give the same bits. */
static void rotate(const uint16_t *x, const uint16_t *c, const uint16_t *sn, int d, uint16_t *dst) {
    for (int i = 0; i < d; i++) {
        uint16_t a = f32_to_bf16(bf16_to_f32(x[i]) * bf16_to_f32(c[i]));
        uint16_t rot = f32_to_bf16(bf16_to_f32(x[(i + d / 2) % d]) * bf16_to_f32(sn[i]));
        dst[i] = f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(rot));
    }
}

__attribute__((target("avx2,fma")))
static void rotate_avx2(const uint16_t *x, const uint16_t *c, const uint16_t *sn, int d, uint16_t *dst) {
    for (int i = 0; i < d; i += 8) {          /* d % 16 == 0: 8 lanes never straddle the half */
        __m256 a = round8_bf16(_mm256_mul_ps(load8_bf16(x + i), load8_bf16(c + i)));
        __m256 rot = round8_bf16(_mm256_mul_ps(load8_bf16(x + (i + d / 2) % d), load8_bf16(sn + i)));
        store8_bf16(dst + i, _mm256_add_ps(a, rot));
    }
}

/* x [b*t, H] -> q [b, h, t, d] and the new K/V rows where `kw` says: RMSNorm, the fused q/k/v projection,
 * Qwen3's per-head RMSNorm of q and k where qn_w and kn_w are given, then the rotation of q and k by
 * cos, sin [b, t, d] (sin's first half negated, as Rotary.cos_sin gives it). normed [b*t, H] and
 * proj [b*t, (h + 2 hkv) d] are scratch. */
static int attn_in(const uint16_t *x, int b, int t, int H, const uint16_t *norm_w, float eps, const uint8_t *w,
                   const uint16_t *scales, int bits, int act_bits, int h, int hkv, int d, const uint16_t *qn_w,
                   const uint16_t *kn_w, const uint16_t *cos, const uint16_t *sin, uint16_t *q, KvWrite kw,
                   uint16_t *normed, uint16_t *proj, int isa, int threads) {
    int rows = b * t, heads = h + 2 * hkv, N = heads * d;
    bd_rmsnorm(x, rows, H, norm_w, eps, normed, isa, threads);
    int rc = bd_qgemm(normed, rows, H, w, scales, N, bits, act_bits, proj, NULL, isa, threads);
    for (int r = 0; r < rows && rc == 0; r++) {
        int bi = r / t, ti = r % t;
        const uint16_t *c = cos + (size_t)r * d, *sn = sin + (size_t)r * d;
        for (int hd = 0; hd < heads; hd++) {
            const uint16_t *src = proj + (size_t)r * N + (size_t)hd * d;
            uint16_t *dst;
            if (hd < h) dst = q + (((size_t)bi * h + hd) * t + ti) * d;
            else if (kw.slots[r] < 0) continue;
            else dst = (hd < h + hkv ? kw.k + (int64_t)(hd - h) * kw.head_stride
                                     : kw.v + (int64_t)(hd - h - hkv) * kw.head_stride) + kw.slots[r] * kw.stride;
            if (hd >= h + hkv) {
                memcpy(dst, src, 2 * (size_t)d);
                continue;
            }
            uint16_t normed_head[256];
            if (qn_w) {
                bd_rmsnorm(src, 1, d, hd < h ? qn_w : kn_w, eps, normed_head, isa, 1);
                src = normed_head;
            }
            if (isa != ISA_PORTABLE) rotate_avx2(src, c, sn, d, dst);
            else rotate(src, c, sn, d, dst);
        }
    }
    return rc;
}

/* One quantized decoder layer's weights (cpu_kernels.py's LayerTable mirrors it). */
typedef struct {
    const uint16_t *norm1, *norm2, *q_norm, *k_norm;        /* q_norm, k_norm: NULL but for Qwen3 */
    const uint8_t *qkv, *o, *gate_up, *down;
    const uint16_t *qkv_s, *o_s, *gate_up_s, *down_s;
} LayerPtrs;

/* The final norm and LM head after the layers (cpu_kernels.py's HeadTable mirrors it): normed [b*t, H] =
 * RMSNorm(x) by norm (eps), logits [b*t, n] = normed times the packed head (bits, act_bits), as the model's
 * norm and head modules compute them over these kernels, and each row's argmax [b*t] (bd_argmax's index). */
typedef struct {
    const uint16_t *norm;
    float eps;
    const uint8_t *w;
    const uint16_t *s;
    int n, bits, act_bits;
    uint16_t *normed, *logits;
    int64_t *argmax;
} HeadPtrs;

void bd_argmax(const void *x, int rows, int n, int64_t stride, int bf16, int64_t *out, int isa);

/* x_in [b*t, H] through n layers -> x [b*t, H], and a copy of the hidden state after each layer taps[i] in
 * tap_out[i] (i < n_taps; the drafter's taps); then, where head is not NULL, the final norm and LM head of
 * every row (HeadPtrs). Layer l writes its new K/V rows into k_pools[l] /
 * v_pools[l] at write_slots [b*t] and attends to the keys at read_slots [b, tk] (both as KvWrite and
 * KvRead spell them, with slot_stride and head_stride), visible where vis (strides (batch, query row,
 * key)) says. cos, sin [b, t, d]; scale the attention's. Returns 0, or < 0 as the kernels above. */
int bd_layers(const uint16_t *x_in, uint16_t *x, const int *taps, uint16_t *const *tap_out, int n_taps, int b,
              int t, const LayerPtrs *layers, int n, int H, int h, int hkv, int d, int I, int bits, int act_bits,
              float eps,
              float scale, const uint16_t *cos, const uint16_t *sin, uint16_t *const *k_pools,
              uint16_t *const *v_pools, const int64_t *write_slots,
              const int64_t *read_slots, int tk, int64_t slot_stride, int64_t head_stride, const uint8_t *vis,
              const int64_t *vis_strides, const HeadPtrs *head, int isa, int threads) {
    size_t rows = (size_t)b * t, N = (size_t)(h + 2 * hkv) * d, hd = (size_t)h * d;
    size_t elems = rows * (H + N + hd + hd + H + 2 * (size_t)I + I);
    uint16_t *scratch = malloc(2 * elems);
    if (!scratch) return -1;
    uint16_t *normed = scratch, *proj = normed + rows * H, *q = proj + rows * N, *heads = q + rows * hd,
             *x1 = heads + rows * hd, *gu = x1 + rows * H, *act = gu + rows * 2 * I;
    const int64_t strides[3] = {0, head_stride, slot_stride};
    memcpy(x, x_in, 2 * rows * H);
    int rc = 0;
    for (int l = 0; l < n && rc == 0; l++) {
        const LayerPtrs *L = layers + l;
        KvWrite kw = {k_pools[l], v_pools[l], write_slots, slot_stride, head_stride};
        KvRead kr = {k_pools[l], v_pools[l], strides, strides, read_slots};
        rc = attn_in(x, b, t, H, L->norm1, eps, L->qkv, L->qkv_s, bits, act_bits, h, hkv, d, L->q_norm, L->k_norm, cos, sin, q,
                     kw, normed, proj, isa, threads);
        if (rc == 0) rc = attend(q, b, h, t, d, kr, hkv, tk, vis, vis_strides, scale, heads, isa, threads);
        if (rc == 0) rc = bd_qgemm(heads, (int)rows, (int)hd, L->o, L->o_s, H, bits, act_bits, x1, x, isa, threads);
        if (rc == 0) {
            bd_rmsnorm(x1, (int)rows, H, L->norm2, eps, normed, isa, threads);
            rc = bd_qgemm(normed, (int)rows, H, L->gate_up, L->gate_up_s, 2 * I, bits, act_bits, gu, NULL, isa, threads);
        }
        if (rc == 0) {
            bd_swiglu(gu, 2 * I, gu + I, 2 * I, (int)rows, I, act, isa, threads);
            rc = bd_qgemm(act, (int)rows, I, L->down, L->down_s, H, bits, act_bits, x, x1, isa, threads);
        }
        for (int i = 0; i < n_taps; i++)
            if (taps[i] == l) memcpy(tap_out[i], x, 2 * rows * H);
    }
    free(scratch);
    if (rc == 0 && head) {
        bd_rmsnorm(x, (int)rows, H, head->norm, head->eps, head->normed, isa, threads);
        rc = bd_qgemm(head->normed, (int)rows, H, head->w, head->s, head->n, head->bits, head->act_bits, head->logits,
                      NULL, isa, threads);
        if (rc == 0) bd_argmax(head->logits, (int)rows, head->n, head->n, 1, head->argmax, isa);
    }
    return rc;
}

/* ---- Gated DeltaNet recurrence (layers/deltanet.py), fp32, one token at a time ----
 * For each (sequence, head), over its rows in order: S = S * decay; mem = S^T k; delta = (v - mem) * beta;
 * S += k delta^T; o = S^T q. Sums over d_k run in index order, every product and sum rounded on its own
 * (no contraction). Each (sequence, head) is one unit of work, so a row's result does not depend on the
 * batch or the thread count. (PyTorch's reductions order the same sums otherwise: the two paths agree to
 * fp32 rounding, not bitwise, and a process uses one of them for every row.) Padding rows (valid[row] == 0) leave the
 * state as it was and write zeros. q, k [b, t, h, dk]; v, out [b, t, h, dv]; decay, beta, valid [b, t, h]
 * / [b, t]; state, final [b, h, dk, dv]; per_row (optional) [b, t, h, dk, dv]: the state after each row. */
void bd_delta_rule(const float *state, const float *q, const float *k, const float *v, const float *decay,
                   const float *beta, const uint8_t *valid, int b, int t, int h, int dk, int dv, float *out,
                   float *final, float *per_row, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int bh = 0; bh < b * h; bh++) {
        int bi = bh / h, hi = bh % h;
        size_t area = (size_t)dk * dv;
        float *S = final + (size_t)bh * area;
        float *mem = malloc(sizeof(float) * 2 * (size_t)dv), *delta = mem + dv;
        memcpy(S, state + (size_t)bh * area, sizeof(float) * area);
        for (int r = 0; r < t; r++) {
            size_t row = (size_t)bi * t + r, at = row * h + hi;
            const float *qr = q + at * dk, *kr = k + at * dk, *vr = v + at * dv;
            float *o = out + at * dv;
            if (valid == NULL || valid[row]) {
                float a = decay[at], be = beta[at];
                for (int j = 0; j < dv; j++) mem[j] = 0.0f;
                for (int i = 0; i < dk; i++) {
                    float *s = S + (size_t)i * dv, ki = kr[i];
                    for (int j = 0; j < dv; j++) {
                        s[j] = s[j] * a;
                        mem[j] = mem[j] + s[j] * ki;
                    }
                }
                for (int j = 0; j < dv; j++) delta[j] = (vr[j] - mem[j]) * be;
                for (int j = 0; j < dv; j++) o[j] = 0.0f;
                for (int i = 0; i < dk; i++) {
                    float *s = S + (size_t)i * dv, ki = kr[i], qi = qr[i];
                    for (int j = 0; j < dv; j++) {
                        s[j] = s[j] + ki * delta[j];
                        o[j] = o[j] + s[j] * qi;
                    }
                }
            } else {
                for (int j = 0; j < dv; j++) o[j] = 0.0f;
            }
            if (per_row != NULL) memcpy(per_row + at * area, S, sizeof(float) * area);
        }
        free(mem);
    }
}

/* ---- argmax over the last dimension, as torch's: the first NaN of a row if it has one, else the first of
 * its largest values (ties -> lowest index) ---- */

static inline float argmax_at(const void *row, int bf16, int i) {
    return bf16 ? bf16_to_f32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

/* the portable path, and every path's NaN rule and tail: from `best` at `at`, indices from..n-1 */
static int64_t argmax_scan(const void *row, int bf16, int from, int n, float best, int64_t at) {
    for (int i = from; i < n; i++) {
        float v = argmax_at(row, bf16, i);
        if (v > best) best = v, at = i;
    }
    return at;
}

static int64_t first_nan(const void *row, int bf16, int n) {
    for (int i = 0; i < n; i++)
        if (isnan(argmax_at(row, bf16, i))) return i;
    return -1;
}

/* 16 lanes, each keeping its first largest value and where it was (strict >: a later equal value does not
 * move it; NaN compares false and is looked for apart), then the largest over lanes at its lowest index */
__attribute__((target("avx512f")))
static int64_t argmax_row_avx512(const void *row, int bf16, int n) {
    int full = n / 16 * 16;
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), at = idx;
    const __m512i step = _mm512_set1_epi32(16);
#define LOAD16(i) (bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(                                          \
                              _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + (i)))), 16)) \
                        : _mm512_loadu_ps((const float *)row + (i)))
    __m512 best = LOAD16(0);
    __mmask16 nan = _mm512_cmp_ps_mask(best, best, _CMP_UNORD_Q);
    for (int i = 16; i < full; i += 16) {
        __m512 v = LOAD16(i);
        idx = _mm512_add_epi32(idx, step);
        __mmask16 up = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        best = _mm512_mask_mov_ps(best, up, v);
        at = _mm512_mask_mov_epi32(at, up, idx);
    }
#undef LOAD16
    if (nan) return first_nan(row, bf16, n);
    float top = _mm512_reduce_max_ps(best);
    __mmask16 tops = _mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ);
    int64_t first = _mm512_mask_reduce_min_epi32(tops, at);
    for (int i = full; i < n; i++)
        if (isnan(argmax_at(row, bf16, i))) return i;
    return argmax_scan(row, bf16, full, n, top, first);
}

static int64_t argmax_row(const void *row, int bf16, int n, int isa) {
    if (isa >= ISA_AVX512VNNI && n >= 16) return argmax_row_avx512(row, bf16, n);
    int64_t nan_at = first_nan(row, bf16, n);
    return nan_at >= 0 ? nan_at : argmax_scan(row, bf16, 1, n, argmax_at(row, bf16, 0), 0);
}

/* out[r] = argmax of row r (n values, bf16 or fp32, rows `stride` elements apart) */
void bd_argmax(const void *x, int rows, int n, int64_t stride, int bf16, int64_t *out, int isa) {
    size_t size = bf16 ? 2 : 4;
    for (int r = 0; r < rows; r++) out[r] = argmax_row((const char *)x + (size_t)r * stride * size, bf16, n, isa);
}

/* ---- DSpark's Markov bias for inference: out[r, v] = sum over k = 0..rank-1, in order, of e[r, k] * W2[v, k] ----
 * fp32, every term added by one fused multiply-add (acc = fma(e[r, k], W2[v, k], acc), acc from +0), W2 read
 * as bf16: each output is that one chain of operations, so the AVX512, AVX2 and portable spellings give the
 * same bits, whatever the row count, the thread count or the column tiling. Weight layout (written by
 * layers/cpu_kernels.py): blocks of 128 columns, each block's rank x 128 values contiguous (wb[block][k][c]),
 * the last block padded with zero columns, so a block streams from memory in order. */
#define MARKOV_BLOCK 128

static void markov_block_portable(const float *e, int rank, const uint16_t *wb, float acc[MARKOV_BLOCK]) {
    for (int c = 0; c < MARKOV_BLOCK; c++) acc[c] = 0.0f;
    for (int k = 0; k < rank; k++)
        for (int c = 0; c < MARKOV_BLOCK; c++) acc[c] = fmaf(e[k], bf16_to_f32(wb[k * MARKOV_BLOCK + c]), acc[c]);
}

__attribute__((target("avx2,fma")))
static void markov_block_avx2(const float *e, int rank, const uint16_t *wb, float acc[MARKOV_BLOCK]) {
    for (int h = 0; h < MARKOV_BLOCK; h += 64) {          /* 64 columns at a time: 8 accumulators */
        __m256 a[8];
        for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
        for (int k = 0; k < rank; k++) {
            __m256 ek = _mm256_set1_ps(e[k]);
            const uint16_t *w = wb + k * MARKOV_BLOCK + h;
            for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(ek, load8_bf16(w + 8 * j), a[j]);
        }
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(acc + h + 8 * j, a[j]);
    }
}

__attribute__((target("avx512f,avx512bw,avx2,fma")))
static void markov_block_avx512(const float *e, int rank, const uint16_t *wb, float acc[MARKOV_BLOCK]) {
    __m512 a[8];                                           /* the block's 128 columns */
    for (int j = 0; j < 8; j++) a[j] = _mm512_setzero_ps();
    for (int k = 0; k < rank; k++) {
        __m512 ek = _mm512_set1_ps(e[k]);
        const uint16_t *w = wb + k * MARKOV_BLOCK;
        for (int j = 0; j < 8; j++) a[j] = _mm512_fmadd_ps(ek, load16_bf16(w + 16 * j), a[j]);
    }
    for (int j = 0; j < 8; j++) _mm512_storeu_ps(acc + 16 * j, a[j]);
}

/* row e's 128 sums of one block, on the path `isa` names */
static void markov_block(const float *e, int rank, const uint16_t *wb, float acc[MARKOV_BLOCK], int isa) {
    if (isa >= ISA_AVX512VNNI) markov_block_avx512(e, rank, wb, acc);
    else if (isa == ISA_AVX2) markov_block_avx2(e, rank, wb, acc);
    else markov_block_portable(e, rank, wb, acc);
}

/* Every row's 128 sums of every block, each block once from memory, then per row either copied to out [rows, V]
 * (the bias) or, where out is NULL, added to the row's logits (bf16 or fp32, rows `stride` elements apart) with
 * the block's first NaN or first largest sum and where it is kept in top / at [rows, blocks] (bd_markov_argmax) */
static void markov_pass(const float *e, int rows, int rank, const uint16_t *wb, int V, int isa, int threads, float *out,
                        const void *logits, int64_t stride, int bf16, float *top, int64_t *at) {
    int blocks = (V + MARKOV_BLOCK - 1) / MARKOV_BLOCK;
    size_t size = bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < blocks; b++) {
        const uint16_t *w = wb + (size_t)b * rank * MARKOV_BLOCK;
        int c0 = b * MARKOV_BLOCK, n = V - c0 < MARKOV_BLOCK ? V - c0 : MARKOV_BLOCK;
        float acc[MARKOV_BLOCK];
        for (int r = 0; r < rows; r++) {
            markov_block(e + (size_t)r * rank, rank, w, acc, isa);
            if (out != NULL) {
                memcpy(out + (size_t)r * V + c0, acc, sizeof(float) * n);
                continue;
            }
            const void *row = (const char *)logits + (size_t)r * stride * size;
            for (int c = 0; c < n; c++) acc[c] = argmax_at(row, bf16, c0 + c) + acc[c];
            int64_t i = argmax_row(acc, 0, n, isa);
            top[(size_t)r * blocks + b] = acc[i];
            at[(size_t)r * blocks + b] = c0 + i;
        }
    }
}

void bd_markov_bias(const float *e, int rows, int rank, const uint16_t *wb, int V, float *out, int isa, int threads) {
    markov_pass(e, rows, rank, wb, V, isa, threads, out, NULL, 0, 0, NULL, NULL);
}

/* ---- one greedy step of DSpark's Markov chain: out[r] = argmax over v of logits[r, v] + (W2 e_r)[v] ----
 * Each score is bd_markov_bias's sum for v and then one fp32 addition of the logit (bf16 widened exactly, or
 * fp32): the values `logits.float() + bias` holds, and the index bd_argmax gives for them (the first NaN, else
 * the first largest), without writing the [rows, V] fp32 rows between. Each 128-column block keeps its own
 * first NaN or first largest value; the blocks are then folded in column order (a NaN wins, else strictly
 * larger values), so the thread count does not change the result. Returns 0, or -1 without scratch memory. */
int bd_markov_argmax(const float *e, int rows, int rank, const uint16_t *wb, int V, const void *logits,
                     int64_t stride, int bf16, int64_t *out, int isa, int threads) {
    int blocks = (V + MARKOV_BLOCK - 1) / MARKOV_BLOCK;
    float *top = malloc(sizeof(float) * (size_t)rows * blocks);
    int64_t *at = malloc(sizeof(int64_t) * (size_t)rows * blocks);
    if (top == NULL || at == NULL) {
        free(top), free(at);
        return -1;
    }
    markov_pass(e, rows, rank, wb, V, isa, threads, NULL, logits, stride, bf16, top, at);
    for (int r = 0; r < rows; r++) {
        const float *t = top + (size_t)r * blocks;
        const int64_t *a = at + (size_t)r * blocks;
        int best = 0;
        for (int b = 0; b < blocks && !isnan(t[best]); b++)
            if (isnan(t[b]) || t[b] > t[best]) best = b;
        out[r] = a[best];
    }
    free(top), free(at);
    return 0;
}
