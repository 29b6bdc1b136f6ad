/*
 * attnverify.normalizers._fused: a fused float32 softmax over the last dimension (CPU), the
 * kernel of the `softmax_fused` target (fused.py registers it as the torch operator
 * attnverify::softmax_fused). The built-in `softmax`, its reference, runs torch.softmax.
 *
 * Why it exists: torch.softmax on CPU spends most of its time in exp (torch.exp alone measured
 * 8x a same-size copy); on the benchmark machine softmax takes 5.1-6.3x a copy. This kernel
 * does one read pass for the row maximum, one pass computing exp and the row sum into the
 * output (the row is then in L1), and one in-cache scaling pass, with a table-and-polynomial
 * exp (below) whose error is under 1 ulp.
 *
 * Semantics are those of attnverify's softmax (docs/NORMALIZERS.md):
 *   - the argument is (x_i - max), divided by T when T != 1: shifted first, so it is <= 0, exp
 *     never overflows and a large |x| / T neither overflows nor loses the difference to
 *     rounding (x/T - max/T would); the reference path computes the same expression;
 *   - -inf (a masked key) gives exactly 0; a fully masked row gives zeros;
 *   - a row holding NaN or +inf is not computed here: the call returns how many such rows it
 *     met and the caller recomputes the tensor with softmax's torch path.
 * The vector paths sum exp in float32 lanes (32 or 16 partial sums), the portable path in one
 * double, so the three paths can differ by a few ulp; each is tested against float64.
 *
 * Instruction sets: AVX-512F, AVX2+FMA and portable C, chosen at run time (or forced by the
 * caller, so that every path is tested on a machine that has AVX-512). Rows are split over
 * `nthreads` OpenMP threads when the tensor is large enough. torch's wheel ships its libgomp
 * under the soname libgomp.so.1 and attnverify imports torch first, so this module binds to
 * torch's OpenMP runtime and its thread pool, not a second one (checked for the 2.13.0 CPU
 * wheel; a torch build that renames its libgomp would load a second runtime: correct results,
 * two thread pools).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define AV_X86 1
#include <immintrin.h>
#else
#define AV_X86 0
#endif

/* Bumped whenever the kernel's results change; the Python side refuses a build that differs
 * (a stale in-place build after an edit), see attnverify/normalizers/fused.py. */
#define KERNEL_VERSION 4

enum { ISA_AUTO = 0, ISA_SCALAR = 1, ISA_AVX2 = 2, ISA_AVX512 = 3 };

/* exp argument floor: exp(-110) is far below the smallest float32 subnormal, so it rounds to 0. */
#define EXP_LO (-110.0f)
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO (-2.12194440e-4f)
/* Vector exp: a = (k + j/N) ln2 + r with j = k mod N, |r| <= ln2/(2N), N = 16 (AVX-512) or 8
 * (AVX2); exp(a) = 2^floor(k/N) * 2^(j/N) * (1 + r + c2 r^2 + c3 r^3 [+ r^4/24]), the 2^(j/N)
 * from a register-held table. k comes from the 1.5 * 2^23 rounding trick: the low bits of
 * t = a*N*log2(e) + MAGIC are k itself.
 *   N = 16: minimax c2, c3 (fitted on |r| <= ln2/32; truncation 2.3e-9 relative, 0.02 ulp);
 *   N = 8: Taylor to r^4 (truncation 1.3e-9).
 * Measured max error against double exp on [-87, -30], tests/test_fused.py: about 1 ulp, the
 * rest being the table's and the products' float32 rounding. */
#define MAGIC 12582912.0f
#define EXP16_C2 0.5000195f
#define EXP16_C3 0.16667052f
static const float EXP2_16[16] = {
    1.0f, 1.0442737824274138f, 1.0905077326652577f, 1.1387886347566916f,
    1.1892071150027210f, 1.2418578120734840f, 1.2968395546510096f, 1.3542555469368927f,
    1.4142135623730951f, 1.4768261459394993f, 1.5422108254079407f, 1.6104903319492543f,
    1.6817928305074290f, 1.7562521603732995f, 1.8340080864093424f, 1.9152065613971474f,
};
static const float EXP2_8[8] = {
    1.0f, 1.0905077326652577f, 1.1892071150027210f, 1.2968395546510096f,
    1.4142135623730951f, 1.5422108254079407f, 1.6817928305074290f, 1.8340080864093424f,
};
/* Cephes expf (portable path): exp(r) = 1 + r + r^2 * P(r) on |r| <= ln2/2. */
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f

/* Row result: 0 computed, 1 must be recomputed by the caller (NaN or +inf in the row). */
typedef int (*row_fn)(const float *x, float *y, int64_t n, float temperature);

/* ------------------------------------------------------------------ portable C */

static float exp_scalar(float a) {
    if (a < EXP_LO) a = EXP_LO;
    float k = nearbyintf(a * LOG2E);
    float r = a - k * LN2_HI;
    r = r - k * LN2_LO;
    float p = P0;
    p = p * r + P1;
    p = p * r + P2;
    p = p * r + P3;
    p = p * r + P4;
    p = p * r + P5;
    float e = p * (r * r) + r + 1.0f;
    return ldexpf(e, (int)k);
}

static int row_scalar(const float *x, float *y, int64_t n, float temperature) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) return 1;
        if (x[i] > m) m = x[i];
    }
    if (m == INFINITY) return 1;
    if (m == -INFINITY) {
        memset(y, 0, (size_t)n * sizeof(float));
        return 0;
    }
    const int scaled = temperature != 1.0f;
    double s = 0.0; /* one accumulator: double keeps its error below float32's rounding */
    for (int64_t i = 0; i < n; i++) {
        float e = exp_scalar(scaled ? (x[i] - m) / temperature : x[i] - m);
        y[i] = e;
        s += e;
    }
    const float inv = 1.0f / (float)s;
    for (int64_t i = 0; i < n; i++) y[i] *= inv;
    return 0;
}

#if AV_X86
/* ------------------------------------------------------------------ AVX2 + FMA */

__attribute__((target("avx2,fma"))) static inline __m256 exp_avx2(__m256 a) {
    a = _mm256_max_ps(_mm256_set1_ps(EXP_LO), a);
    const __m256 magic = _mm256_set1_ps(MAGIC);
    __m256 t = _mm256_fmadd_ps(a, _mm256_set1_ps(8.0f * LOG2E), magic);
    __m256 k = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_HI / 8), a);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_LO / 8), r);
    __m256i ki = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
    __m256 tb = _mm256_permutevar8x32_ps(_mm256_loadu_ps(EXP2_8), ki);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 24), r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    __m256 e = _mm256_fmadd_ps(tb, p, tb);
    /* 2^floor(k/8) as two normal powers of two (it is >= -159, so each half is >= -80): a
     * result in the subnormal range is rounded once, correctly. */
    __m256i n = _mm256_srai_epi32(ki, 3);
    __m256i n1 = _mm256_srai_epi32(n, 1);
    __m256i n2 = _mm256_sub_epi32(n, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(e, s1), s2);
}

__attribute__((target("avx2,fma"))) static inline float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static int row_avx2(const float *x, float *y, int64_t n,
                                                          float temperature) {
    const int64_t nv = n & ~(int64_t)7;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    __m256 bad = _mm256_setzero_ps();
    for (int64_t i = 0; i < nv; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        vmax = _mm256_max_ps(vmax, v);
    }
    float m = hmax256(vmax);
    if (_mm256_movemask_ps(bad)) return 1;
    for (int64_t i = nv; i < n; i++) {
        if (x[i] != x[i]) return 1;
        if (x[i] > m) m = x[i];
    }
    if (m == INFINITY) return 1;
    if (m == -INFINITY) {
        memset(y, 0, (size_t)n * sizeof(float));
        return 0;
    }
    const int scaled = temperature != 1.0f;
    const __m256 vt = _mm256_set1_ps(temperature);
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= nv; i += 16) {
        __m256 a = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
        __m256 b = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vm);
        if (scaled) {
            a = _mm256_div_ps(a, vt);
            b = _mm256_div_ps(b, vt);
        }
        __m256 ea = exp_avx2(a), eb = exp_avx2(b);
        _mm256_storeu_ps(y + i, ea);
        _mm256_storeu_ps(y + i + 8, eb);
        acc0 = _mm256_add_ps(acc0, ea);
        acc1 = _mm256_add_ps(acc1, eb);
    }
    for (; i < nv; i += 8) {
        __m256 a = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
        if (scaled) a = _mm256_div_ps(a, vt);
        __m256 ea = exp_avx2(a);
        _mm256_storeu_ps(y + i, ea);
        acc0 = _mm256_add_ps(acc0, ea);
    }
    if (i < n) { /* tail: padded with -inf, which gives exp = 0 */
        float buf[8];
        for (int j = 0; j < 8; j++) buf[j] = i + j < n ? x[i + j] : -INFINITY;
        __m256 a = _mm256_sub_ps(_mm256_loadu_ps(buf), vm);
        if (scaled) a = _mm256_div_ps(a, vt);
        __m256 ea = exp_avx2(a);
        _mm256_storeu_ps(buf, ea);
        for (int64_t j = 0; i + j < n; j++) y[i + j] = buf[j];
        acc1 = _mm256_add_ps(acc1, ea);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum256(_mm256_add_ps(acc0, acc1)));
    for (i = 0; i < nv; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), inv));
    for (; i < n; i++) y[i] *= _mm256_cvtss_f32(inv);
    return 0;
}

/* ------------------------------------------------------------------ AVX-512F */

__attribute__((target("avx512f"))) static inline __m512 exp_avx512(__m512 a) {
    a = _mm512_max_ps(_mm512_set1_ps(EXP_LO), a);
    const __m512 magic = _mm512_set1_ps(MAGIC);
    __m512 t = _mm512_fmadd_ps(a, _mm512_set1_ps(16.0f * LOG2E), magic);
    __m512 k = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_HI / 16), a);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_LO / 16), r);
    /* vpermps reads the low 4 bits of each index lane: those of t are k mod 16. */
    __m512 tb = _mm512_permutexvar_ps(_mm512_castps_si512(t), _mm512_loadu_ps(EXP2_16));
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(EXP16_C3), r, _mm512_set1_ps(EXP16_C2));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    __m512 e = _mm512_fmadd_ps(tb, p, tb);
    /* e * 2^floor(k/16) (vscalefps floors its second operand); subnormals rounded once */
    return _mm512_scalef_ps(e, _mm512_mul_ps(k, _mm512_set1_ps(1.0f / 16)));
}

__attribute__((target("avx512f"))) static int row_avx512(const float *x, float *y, int64_t n,
                                                           float temperature) {
    const int64_t nv = n & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (n - nv)) - 1u);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 vmax0 = ninf, vmax1 = ninf;
    __mmask16 bad = 0;
    int64_t i = 0;
    for (; i + 32 <= nv; i += 32) {
        __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        bad |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); /* unordered: a or b is NaN */
        vmax0 = _mm512_max_ps(vmax0, a);
        vmax1 = _mm512_max_ps(vmax1, b);
    }
    for (; i < nv; i += 16) {
        __m512 a = _mm512_loadu_ps(x + i);
        bad |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        vmax0 = _mm512_max_ps(vmax0, a);
    }
    if (tail) {
        __m512 a = _mm512_mask_loadu_ps(ninf, tail, x + nv);
        bad |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        vmax1 = _mm512_max_ps(vmax1, a);
    }
    if (bad) return 1;
    const float m = _mm512_reduce_max_ps(_mm512_max_ps(vmax0, vmax1));
    if (m == INFINITY) return 1;
    if (m == -INFINITY) {
        memset(y, 0, (size_t)n * sizeof(float));
        return 0;
    }
    const int scaled = temperature != 1.0f;
    const __m512 vt = _mm512_set1_ps(temperature);
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (i = 0; i + 32 <= nv; i += 32) {
        __m512 a = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
        __m512 b = _mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vm);
        if (scaled) {
            a = _mm512_div_ps(a, vt);
            b = _mm512_div_ps(b, vt);
        }
        __m512 ea = exp_avx512(a), eb = exp_avx512(b);
        _mm512_storeu_ps(y + i, ea);
        _mm512_storeu_ps(y + i + 16, eb);
        acc0 = _mm512_add_ps(acc0, ea);
        acc1 = _mm512_add_ps(acc1, eb);
    }
    for (; i < nv; i += 16) {
        __m512 a = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
        if (scaled) a = _mm512_div_ps(a, vt);
        __m512 ea = exp_avx512(a);
        _mm512_storeu_ps(y + i, ea);
        acc0 = _mm512_add_ps(acc0, ea);
    }
    if (tail) {
        __m512 a = _mm512_sub_ps(_mm512_mask_loadu_ps(ninf, tail, x + nv), vm);
        if (scaled) a = _mm512_div_ps(a, vt);
        __m512 ea = exp_avx512(a);
        _mm512_mask_storeu_ps(y + nv, tail, ea);
        acc1 = _mm512_add_ps(acc1, ea);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)));
    for (i = 0; i < nv; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), inv));
    if (tail) _mm512_mask_storeu_ps(y + nv, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, y + nv), inv));
    return 0;
}
#endif /* AV_X86 */

/* ------------------------------------------------------------------ dispatch and threads */

static int best_isa(void) {
#if AV_X86 && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
#endif
    return ISA_SCALAR;
}

static row_fn row_for(int isa) {
#if AV_X86
    if (isa == ISA_AVX512) return row_avx512;
    if (isa == ISA_AVX2) return row_avx2;
#endif
    return row_scalar;
}

/* Below this many elements per thread a thread costs more than it saves. */
#define MIN_PER_THREAD (1 << 15)

static PyObject *softmax_f32(PyObject *self, PyObject *args) {
    unsigned long long xp, yp;
    long long rows, n;
    double temperature;
    int nthreads, isa;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKLLdii", &xp, &yp, &rows, &n, &temperature, &nthreads, &isa))
        return NULL;
    if (rows < 0 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "rows and n must be nonnegative");
        return NULL;
    }
    if (!isnormal((float)temperature) || !((float)temperature > 0.0f)) {
        PyErr_SetString(PyExc_ValueError, "temperature must be a positive normal float32");
        return NULL;
    }
    const int best = best_isa();
    if (isa == ISA_AUTO) isa = best;
    if (isa < ISA_SCALAR || isa > best) {
        PyErr_Format(PyExc_ValueError, "instruction set %d not available (best here: %d)", isa, best);
        return NULL;
    }
    if (rows == 0 || n == 0) return PyLong_FromLong(0);

    long long want = (rows * n) / MIN_PER_THREAD;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > want) nthreads = (int)(want > 1 ? want : 1);
    if (nthreads > rows) nthreads = (int)rows;

    const row_fn fn = row_for(isa);
    const float *x = (const float *)(uintptr_t)xp;
    float *y = (float *)(uintptr_t)yp;
    const float t = (float)temperature;
    long long flagged = 0;
    Py_BEGIN_ALLOW_THREADS
    if (nthreads == 1) { /* no parallel region at all: small calls stay cheap */
        for (long long r = 0; r < rows; r++) flagged += fn(x + r * n, y + r * n, n, t);
    } else {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nthreads) reduction(+ : flagged)
#endif
        for (long long r = 0; r < rows; r++) flagged += fn(x + r * n, y + r * n, n, t);
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(flagged);
}

/* ------------------------------------------------------------------ backward */

/* The softmax backward of one row, torch's own formula: dx = y * (g - sum(g * y)), divided by
 * T when T != 1 (the forward divided its argument by T). Sixteen partial sums in float32 lanes,
 * as the forward sums exp; the elementwise pass is vectorised by the compiler, in one clone per
 * instruction set picked at load time (GCC's target_clones). */
#if AV_X86 && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void backward_row(const float *g, const float *y, float *dx, long long n, float t) {
    float acc[16] = {0.0f};
    long long i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += g[i + k] * y[i + k];
    float s = 0.0f;
    for (int k = 0; k < 16; k++) s += acc[k];
    for (; i < n; i++) s += g[i] * y[i];
    if (t == 1.0f) {
        for (i = 0; i < n; i++) dx[i] = y[i] * (g[i] - s);
    } else {
        for (i = 0; i < n; i++) dx[i] = y[i] * (g[i] - s) / t;
    }
}

static PyObject *softmax_backward_f32(PyObject *self, PyObject *args) {
    unsigned long long gp, yp, dp;
    long long rows, n;
    double temperature;
    int nthreads;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKLLdi", &gp, &yp, &dp, &rows, &n, &temperature, &nthreads))
        return NULL;
    if (rows < 0 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "rows and n must be nonnegative");
        return NULL;
    }
    if (!isnormal((float)temperature) || !((float)temperature > 0.0f)) {
        PyErr_SetString(PyExc_ValueError, "temperature must be a positive normal float32");
        return NULL;
    }
    if (rows == 0 || n == 0) Py_RETURN_NONE;
    long long want = (rows * n) / MIN_PER_THREAD;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > want) nthreads = (int)(want > 1 ? want : 1);
    if (nthreads > rows) nthreads = (int)rows;
    const float *g = (const float *)(uintptr_t)gp;
    const float *y = (const float *)(uintptr_t)yp;
    float *dx = (float *)(uintptr_t)dp;
    const float t = (float)temperature;
    Py_BEGIN_ALLOW_THREADS
    if (nthreads == 1) {
        for (long long r = 0; r < rows; r++) backward_row(g + r * n, y + r * n, dx + r * n, n, t);
    } else {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nthreads)
#endif
        for (long long r = 0; r < rows; r++) backward_row(g + r * n, y + r * n, dx + r * n, n, t);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *available_isa(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLong(best_isa());
}

static PyObject *kernel_version(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLong(KERNEL_VERSION);
}

static PyMethodDef methods[] = {
    {"softmax_f32", softmax_f32, METH_VARARGS,
     "softmax_f32(x_ptr, y_ptr, rows, n, temperature, nthreads, isa) -> rows left to the caller\n\n"
     "Row-wise softmax of a contiguous (rows, n) float32 array into another. Returns the number\n"
     "of rows holding NaN or +inf, which were not written.\n"
     "UNCHECKED: the addresses must be valid for rows*n floats; use attnverify.normalizers.fused."},
    {"softmax_backward_f32", softmax_backward_f32, METH_VARARGS,
     "softmax_backward_f32(g_ptr, y_ptr, dx_ptr, rows, n, temperature, nthreads) -> None\n\n"
     "dx = y * (g - sum(g * y, row)) / temperature for contiguous (rows, n) float32 arrays.\n"
     "UNCHECKED: the addresses must be valid for rows*n floats; use attnverify.normalizers.fused."},
    {"available_isa", available_isa, METH_NOARGS,
     "available_isa() -> best instruction set here: 1 portable C, 2 AVX2+FMA, 3 AVX-512F"},
    {"kernel_version", kernel_version, METH_NOARGS, "kernel_version() -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fused", "Fused CPU softmax kernels for attnverify.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fused(void) { return PyModule_Create(&module); }
