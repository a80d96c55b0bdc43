/*
 * Fused kernels for the static decode step (pipeline/engines/hf_lean.py, LeanDecoder(native=)).
 *
 * A decode step of a small model at batch 32 spends most of its time between its matmuls: the
 * attention over the key/value cache (PyTorch's CPU flash-attention kernel re-packs the cache
 * slice for its AMX micro-kernels on every call) and about 25 element-wise ops per layer, each a
 * dispatch and a pass over memory. These three kernels do that work in three calls per layer,
 * with the arithmetic of the PyTorch ops they replace (see pipeline/engines/native_kernels.py for
 * what is the same and what is rounded differently):
 *
 *   lean_add_rms_norm   x = bf16(x + delta); h = bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))
 *   lean_rope_attention RoPE on q and k, k and v written into the cache at `column`, and
 *                       grouped-query attention of every query head over columns start..column
 *   lean_silu_mul       out = bf16(bf16(silu(gate)) * up) for gate_up = [gate | up]
 *
 * and the sampler of the step's float32 logits (hf_sampling.sample_batch without top-k / top-p):
 *
 *   lean_sample         argmax or inverse-CDF sampling of softmax(logits / temperature)
 *
 * bfloat16 values are uint16_t; float32 arithmetic inside; rounding to bfloat16 is round to
 * nearest even, NaN to 0x7fc0, as PyTorch rounds. Built by native_kernels.py with
 * -O3 -mavx512f -mavx512bw -mfma -fopenmp; used only where the CPU has AVX-512 (F and BW).
 * The OpenMP regions run on the calling thread's team of PyTorch's own libgomp.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint16_t bf16;

static inline float bf16_to_float(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* 16 bfloat16 values to float32 (exact) */
static inline __m512 load16(const bf16 *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 float32 values to bfloat16, round to nearest even, NaN to 0x7fc0 */
static inline __m256i round16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(r);
}

static inline void store16(bf16 *p, __m512 v) { _mm256_storeu_si256((__m256i *)p, round16(v)); }

/* float32 rounded through bfloat16 and back: what a PyTorch bfloat16 op's result holds */
static inline __m512 through_bf16(__m512 v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(round16(v)), 16));
}

/* exp(x) for float32 lanes: 2^k * p(r), r = x - k ln 2 in [-ln2/2, ln2/2], p of degree 7
 * (relative error below 2e-7); as expf: x below -87.34 gives 0, above 88.72 gives inf, NaN
 * stays NaN */
static inline __m512 exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.72283f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    const __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512 input = x;
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512 e = _mm512_maskz_mov_ps((__mmask16)~under, _mm512_scalef_ps(p, k));
    e = _mm512_mask_mov_ps(e, over, _mm512_set1_ps(INFINITY));
    return _mm512_mask_mov_ps(e, nan, input);
}

/* x[r] = bf16(x[r] + delta[r]) (delta may be NULL), then h[r] = the Llama RMSNorm of x[r]:
 * bf16(w * bf16(x * (1 / sqrt(sum(x^2) / hidden + eps)))); hidden % 16 == 0 */
void lean_add_rms_norm(bf16 *x, const bf16 *delta, const bf16 *w, bf16 *h, int64_t rows,
                       int64_t hidden, float eps, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows >= 8)
    for (int64_t r = 0; r < rows; r++) {
        bf16 *xr = x + r * hidden;
        bf16 *hr = h + r * hidden;
        __m512 sq = _mm512_setzero_ps();
        for (int64_t i = 0; i < hidden; i += 16) {
            __m512 v = load16(xr + i);
            if (delta) {
                v = through_bf16(_mm512_add_ps(v, load16(delta + r * hidden + i)));
                store16(xr + i, v);
            }
            sq = _mm512_fmadd_ps(v, v, sq);
        }
        float inv = 1.0f / sqrtf(_mm512_reduce_add_ps(sq) / (float)hidden + eps);
        __m512 s = _mm512_set1_ps(inv);
        for (int64_t i = 0; i < hidden; i += 16) {
            __m512 n = through_bf16(_mm512_mul_ps(load16(xr + i), s));
            store16(hr + i, _mm512_mul_ps(load16(w + i), n));
        }
    }
}

/* out[r] = bf16(bf16(silu(gate[r])) * up[r]) with gate_up[r] = [gate | up], each `inter` wide */
void lean_silu_mul(const bf16 *gate_up, bf16 *out, int64_t rows, int64_t inter, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows >= 8)
    for (int64_t r = 0; r < rows; r++) {
        const bf16 *g = gate_up + r * 2 * inter;
        const bf16 *u = g + inter;
        for (int64_t i = 0; i < inter; i += 16) {
            __m512 gv = load16(g + i);
            __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            __m512 silu = through_bf16(_mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
            store16(out + r * inter + i, _mm512_mul_ps(silu, load16(u + i)));
        }
    }
}

/* RoPE of one head vector as PyTorch computes q * cos + rotate_half(q) * sin in bfloat16:
 * each product and the sum rounded to bfloat16. Result as float32 in dst[dim]; dim % 32 == 0. */
static inline void rope(const bf16 *src, const bf16 *cos, const bf16 *sin, int64_t dim, float *dst) {
    const int64_t half = dim / 2;
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    for (int64_t i = 0; i < dim; i += 16) {
        /* torch.neg flips the sign bit (so -(+0) is -0, which 0 - x is not) */
        __m512 rot = i < half ? _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(load16(src + i + half)), sign))
                              : load16(src + i - half);
        __m512 a = through_bf16(_mm512_mul_ps(load16(src + i), load16(cos + i)));
        __m512 b = through_bf16(_mm512_mul_ps(rot, load16(sin + i)));
        _mm512_storeu_ps(dst + i, through_bf16(_mm512_add_ps(a, b)));
    }
}

/* largest group (query heads per key/value head) and head_dim / 16 the attention supports */
#define MAX_GROUP 8
#define MAX_CHUNKS 8
/* how many cache rows ahead of use the attention prefetches keys */
#define PREFETCH_ROWS 16

/*
 * Attention of the `group` query heads q [group, dim] (float32, after RoPE) of one row and one
 * key/value head over n cached keys kb[j * dim] and values vb[j * dim]: scores q.k * scale +
 * bias[j], softmax, weighted sum of the values into o [group, dim] (bfloat16). Inlined at call
 * sites with constant chunks (dim / 16) and group, so the query, the key / value row and the
 * accumulators stay in registers; each key and value row is read once.
 */
static inline __attribute__((always_inline)) void attend(const float *q, const bf16 *kb, const bf16 *vb,
                                                         const bf16 *bias, int64_t n, float scale,
                                                         float *scores, bf16 *o, const int chunks,
                                                         const int group) {
    const int64_t dim = 16 * chunks;
    __m512 qv[MAX_GROUP][MAX_CHUNKS];
    for (int g = 0; g < group; g++)
        for (int c = 0; c < chunks; c++) qv[g][c] = _mm512_loadu_ps(q + g * dim + 16 * c);
    for (int64_t j = 0; j < PREFETCH_ROWS && j < n; j++)
        for (int64_t off = 0; off < dim; off += 32) _mm_prefetch((const char *)(kb + j * dim + off), _MM_HINT_T0);
    for (int64_t j = 0; j < n; j++) {
        /* the cache rows are cold (a step streams all layers' weights between two reads of a
         * layer's cache): fetch keys ahead, and the values the second loop will read */
        for (int64_t off = 0; off < dim; off += 32) {
            _mm_prefetch((const char *)(kb + (j + PREFETCH_ROWS) * dim + off), _MM_HINT_T0);
            _mm_prefetch((const char *)(vb + j * dim + off), _MM_HINT_T1);
        }
        __m512 k[MAX_CHUNKS];
        for (int c = 0; c < chunks; c++) k[c] = load16(kb + j * dim + 16 * c);
        const float b = bf16_to_float(bias[j]);
        for (int g = 0; g < group; g++) {
            __m512 sc = _mm512_mul_ps(qv[g][0], k[0]);
            for (int c = 1; c < chunks; c++) sc = _mm512_fmadd_ps(qv[g][c], k[c], sc);
            scores[g * n + j] = _mm512_reduce_add_ps(sc) * scale + b;
        }
    }
    float total[MAX_GROUP];
    for (int g = 0; g < group; g++) {
        float *sg = scores + g * n;
        __m512 m = _mm512_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(sg + j));
        float mx = _mm512_reduce_max_ps(m);
        for (; j < n; j++) mx = sg[j] > mx ? sg[j] : mx;
        __m512 sum = _mm512_setzero_ps(), mv = _mm512_set1_ps(mx);
        for (j = 0; j + 16 <= n; j += 16) {
            __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sg + j), mv));
            _mm512_storeu_ps(sg + j, e);
            sum = _mm512_add_ps(sum, e);
        }
        if (j < n) {
            __mmask16 tail = (__mmask16)((1u << (n - j)) - 1u);
            __m512 e = _mm512_maskz_mov_ps(tail, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, sg + j), mv)));
            _mm512_mask_storeu_ps(sg + j, tail, e);
            sum = _mm512_add_ps(sum, e);
        }
        total[g] = _mm512_reduce_add_ps(sum);
    }
    __m512 acc[MAX_GROUP][MAX_CHUNKS];
    for (int g = 0; g < group; g++)
        for (int c = 0; c < chunks; c++) acc[g][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        __m512 v[MAX_CHUNKS];
        for (int c = 0; c < chunks; c++) v[c] = load16(vb + j * dim + 16 * c);
        for (int g = 0; g < group; g++) {
            const __m512 p = _mm512_set1_ps(scores[g * n + j]);
            for (int c = 0; c < chunks; c++) acc[g][c] = _mm512_fmadd_ps(p, v[c], acc[g][c]);
        }
    }
    for (int g = 0; g < group; g++) {
        const __m512 inv = _mm512_set1_ps(1.0f / total[g]);
        for (int c = 0; c < chunks; c++) store16(o + g * dim + 16 * c, _mm512_mul_ps(acc[g][c], inv));
    }
}

/*
 * One decode step's attention for one layer.
 *   qkv [rows, (heads + 2 kv_heads) * dim], row stride qkv_stride: the fused q/k/v projection
 *   cos, sin [rows, dim]: the RoPE table rows of each row's position
 *   keys, values: the layer's cache, row r head h column c at r*row_stride + h*head_stride + c*dim
 *   bias [rows, column + 1 - start], row stride bias_stride: added to the scores (0 or -inf)
 *   out [rows, heads * dim]
 * The new key (after RoPE) and value are written at `column`; every query head of kv-head h
 * attends over columns start..column: softmax(q.k * scale + bias) . v, in float32.
 * dim % 32 == 0, dim <= 16 * MAX_CHUNKS, heads / kv_heads <= MAX_GROUP.
 */
void lean_rope_attention(const bf16 *qkv, int64_t qkv_stride, const bf16 *cos, const bf16 *sin,
                         bf16 *keys, bf16 *values, int64_t row_stride, int64_t head_stride,
                         const bf16 *bias, int64_t bias_stride, bf16 *out, int64_t rows,
                         int64_t heads, int64_t kv_heads, int64_t dim, int64_t column, int64_t start,
                         float scale, int threads) {
    const int64_t group = heads / kv_heads, n = column + 1 - start, chunks = dim / 16;
#pragma omp parallel num_threads(threads)
    {
        float *scores = (float *)malloc(sizeof(float) * (size_t)(group * n + dim * group + dim));
        float *q = scores + group * n;      /* [group, dim] after RoPE */
        float *key = q + group * dim;       /* [dim] the new key after RoPE */
#pragma omp for schedule(static)
        for (int64_t task = 0; task < rows * kv_heads; task++) {
            const int64_t r = task / kv_heads, h = task % kv_heads;
            const bf16 *src = qkv + r * qkv_stride;
            const bf16 *cr = cos + r * dim, *sr = sin + r * dim;
            bf16 *kbase = keys + r * row_stride + h * head_stride;
            bf16 *vbase = values + r * row_stride + h * head_stride;
            /* the new key and value into the cache */
            rope(src + (heads + h) * dim, cr, sr, dim, key);
            for (int64_t c = 0; c < chunks; c++) store16(kbase + column * dim + 16 * c, _mm512_loadu_ps(key + 16 * c));
            memcpy(vbase + column * dim, src + (heads + kv_heads + h) * dim, sizeof(bf16) * dim);
            for (int64_t g = 0; g < group; g++) rope(src + (h * group + g) * dim, cr, sr, dim, q + g * dim);
            const bf16 *kb = kbase + start * dim, *vb = vbase + start * dim, *b = bias + r * bias_stride;
            bf16 *o = out + r * heads * dim + h * group * dim;
            /* specialised for common shapes (SmolLM2: 64 / 3; Llama 3: 128 / 4), generic otherwise */
            if (chunks == 4 && group == 3) attend(q, kb, vb, b, n, scale, scores, o, 4, 3);
            else if (chunks == 8 && group == 4) attend(q, kb, vb, b, n, scale, scores, o, 8, 4);
            else attend(q, kb, vb, b, n, scale, scores, o, (int)chunks, (int)group);
        }
        free(scores);
    }
}

/* entries per block of the two-level inverse-CDF search (hf_sampling._BLOCK) */
#define SAMPLE_BLOCK 512

/* x / temperature; a division by 1 (the usual temperature) is skipped: it changes nothing */
static inline __m512 scaled(__m512 x, __m512 t, int divide) { return divide ? _mm512_div_ps(x, t) : x; }

/* max over i of x[i] / temperature */
static inline float row_max(const float *x, int64_t vocab, float temperature) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    const __m512 t = _mm512_set1_ps(temperature);
    const int divide = temperature != 1.0f;
    int64_t i = 0;
    for (; i + 16 <= vocab; i += 16) m = _mm512_max_ps(m, scaled(_mm512_loadu_ps(x + i), t, divide));
    float best = _mm512_reduce_max_ps(m);
    for (; i < vocab; i++) best = x[i] / temperature > best ? x[i] / temperature : best;
    return best;
}

/* e[i - lo] = exp(x[i] / temperature - max) for i in [lo, hi), hi - lo <= SAMPLE_BLOCK; returns
 * their sum (float32 lanes, summed in float64) */
static inline double block_mass(const float *x, int64_t lo, int64_t hi, float temperature, float max, float *e) {
    const __m512 t = _mm512_set1_ps(temperature), m = _mm512_set1_ps(max);
    const int divide = temperature != 1.0f;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = lo;
    for (; i + 16 <= hi; i += 16) {
        __m512 v = exp16(_mm512_sub_ps(scaled(_mm512_loadu_ps(x + i), t, divide), m));
        _mm512_storeu_ps(e + (i - lo), v);
        acc = _mm512_add_ps(acc, v);
    }
    if (i < hi) {
        __mmask16 tail = (__mmask16)((1u << (hi - i)) - 1u);
        __m512 v = _mm512_maskz_mov_ps(tail, exp16(_mm512_sub_ps(scaled(_mm512_maskz_loadu_ps(tail, x + i), t, divide), m)));
        _mm512_mask_storeu_ps(e + (i - lo), tail, v);
        acc = _mm512_add_ps(acc, v);
    }
    return (double)_mm512_reduce_add_ps(acc);
}

/*
 * One token per row of float32 logits [rows, vocab] (hf_sampling.sample_batch without top-k /
 * top-p): temperature[r] <= 0 takes the argmax (first of equal maxima) and reports
 * log_softmax(logits)[token]; otherwise p = softmax(logits / temperature) is sampled by inverse
 * CDF with the row's uniform draw u[r] in [0, 1): the entry i with CDF(i - 1) <= u * total <
 * CDF(i), searched over blocks of SAMPLE_BLOCK entries, then inside the block, with float64
 * running sums; never an entry of probability 0. log_prob[r] = log_softmax(logits /
 * temperature)[token].
 */
void lean_sample(const float *logits, int64_t rows, int64_t vocab, const float *temperature,
                 const double *u, int64_t *token, float *log_prob, int threads) {
    const int64_t blocks = (vocab + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows >= 4)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * vocab;
        const float t = temperature[r] > 0.0f ? temperature[r] : 1.0f;
        const float max = row_max(x, vocab, t);
        double sums[blocks], total = 0.0;
        float e[SAMPLE_BLOCK];
        for (int64_t b = 0; b < blocks; b++) {
            int64_t hi = (b + 1) * SAMPLE_BLOCK < vocab ? (b + 1) * SAMPLE_BLOCK : vocab;
            sums[b] = block_mass(x, b * SAMPLE_BLOCK, hi, t, max, e);
            total += sums[b];
        }
        int64_t pick = 0;
        if (temperature[r] <= 0.0f) {
            for (int64_t i = 1; i < vocab; i++)
                if (x[i] > x[pick]) pick = i;
        } else {
            const double target = u[r] * total;
            double before = 0.0;
            int64_t b = 0, last = 0;
            for (int64_t k = 0; k < blocks; k++)
                if (sums[k] > 0.0) last = k;
            while (b < last && before + sums[b] <= target) before += sums[b++];
            int64_t lo = b * SAMPLE_BLOCK, hi = lo + SAMPLE_BLOCK < vocab ? lo + SAMPLE_BLOCK : vocab;
            block_mass(x, lo, hi, t, max, e);
            double run = before;
            pick = -1;
            int64_t positive = lo;
            for (int64_t i = lo; i < hi; i++) {
                if (e[i - lo] > 0.0f) positive = i;
                run += (double)e[i - lo];
                if (e[i - lo] > 0.0f && run > target) { pick = i; break; }
            }
            if (pick < 0) pick = positive;  /* rounding put the target past the block's end */
        }
        token[r] = pick;
        log_prob[r] = (x[pick] / t - max) - logf((float)total);
    }
}
