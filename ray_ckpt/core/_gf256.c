/*
 * GF(2^8) matrix-times-shards kernel for the Reed-Solomon codec (ray_ckpt.codec).
 *
 * One entry point, `dot(coefficients, rows, cols, inputs, outputs, start, stop)`:
 *
 *     outputs[r][start:stop] = XOR over c of coefficients[r*cols + c] * inputs[c][start:stop]
 *
 * in GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d). Inputs are read once per
 * group of up to GROUP outputs (all outputs of a group accumulate in registers), so encoding
 * RS(k, m<=GROUP) streams the data exactly once. Products use the split-nibble method: a
 * constant times a byte is table_lo[byte & 15] ^ table_hi[byte >> 4], 32 bytes at a time with
 * one byte shuffle per half (AVX2), 16 at a time with SSSE3, one byte at a time otherwise.
 * Where the CPU has GFNI, a constant times a byte is one affine transform instead (the product
 * by c is linear over GF(2): an 8x8 bit matrix, applied by GF2P8AFFINEQB to 64 bytes at a time
 * with AVX-512, 32 with AVX2); GF2P8MULB would use AES's polynomial, not ours.
 * The AVX2 and GFNI kernels look each coefficient's table or matrix up once per call and treat 0
 * and 1 like any other (their tables give 0 and the input); the SSSE3 one skips 0 and XORs for 1.
 * ``use(name)`` picks another of the
 * kernels this CPU runs (tests compare them all with the scalar one).
 *
 * The GIL is released while the bytes flow, so Python threads working on disjoint
 * [start, stop) ranges of the same shards run in parallel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RC_X86 1
#else
#define RC_X86 0
#endif

#define GROUP 4
#define MAX_SHARDS 256

static uint8_t gf_mul_table[256][256];
/* nibble_tables[c][0..15] = c * i, nibble_tables[c][16..31] = c * (i << 4) */
static uint8_t nibble_tables[256][32] __attribute__((aligned(32)));
/* affine_matrices[c]: the bit matrix of "times c" as GF2P8AFFINEQB takes it (row i, the bit i of
 * the product, in byte 7 - i; its bit j set when bit i of c * 2^j is) */
static uint64_t affine_matrices[256];
static int have_avx2 = 0;
static int have_ssse3 = 0;
static int have_gfni_avx2 = 0;
static int have_gfni_avx512 = 0;
enum kernel { SCALAR, SSSE3, AVX2, GFNI_AVX2, GFNI_AVX512 };
static const char *kernel_names[] = {"scalar", "ssse3", "avx2", "gfni-avx2", "gfni-avx512"};
static int kernel = SCALAR; /* the best this CPU runs, unless use() chose another */

static uint8_t gf_mul_slow(uint8_t a, uint8_t b) {
    uint8_t product = 0;
    while (b) {
        if (b & 1) product ^= a;
        a = (uint8_t)((a << 1) ^ ((a & 0x80) ? 0x1d : 0));
        b >>= 1;
    }
    return product;
}

static void init_tables(void) {
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < 256; b++) gf_mul_table[a][b] = gf_mul_slow((uint8_t)a, (uint8_t)b);
    for (int c = 0; c < 256; c++)
        for (int i = 0; i < 16; i++) {
            nibble_tables[c][i] = gf_mul_table[c][i];
            nibble_tables[c][16 + i] = gf_mul_table[c][i << 4];
        }
    for (int c = 0; c < 256; c++) {
        uint64_t matrix = 0;
        for (int i = 0; i < 8; i++) {
            uint64_t row = 0;
            for (int j = 0; j < 8; j++) row |= (uint64_t)((gf_mul_table[c][1 << j] >> i) & 1) << j;
            matrix |= row << (8 * (7 - i));
        }
        affine_matrices[c] = matrix;
    }
}

/* Scalar reference for the tail bytes and for machines without SIMD. */
static void dot_scalar(const uint8_t *coef, int rows, int cols, uint8_t *const *in,
                       uint8_t *const *out, Py_ssize_t start, Py_ssize_t stop) {
    for (int r = 0; r < rows; r++) {
        uint8_t *dst = out[r];
        for (Py_ssize_t i = start; i < stop; i++) {
            uint8_t acc = 0;
            for (int c = 0; c < cols; c++) acc ^= gf_mul_table[coef[r * cols + c]][in[c][i]];
            dst[i] = acc;
        }
    }
}

#if RC_X86
/* Each kernel's body is written once for a group of G outputs, G a compile-time constant at
 * every call (always inlined), so the G accumulators live in registers; a runtime G left them
 * on the stack, a load and a store per product (0.79x ISA-L's AVX2 kernel in cache). */
#define INLINE static inline __attribute__((always_inline))

/* dot_<name>: the bytes of [start, stop) up to a whole number of STEP-byte blocks, through
 * group_<name> for each group of up to GROUP outputs; returns where it stopped (the scalar
 * kernel does the rest). */
#define DOT_KERNEL(name, isa, STEP)                                                           \
    __attribute__((target(isa))) static Py_ssize_t dot_##name(                              \
        const uint8_t *coef, int rows, int cols, uint8_t *const *in, uint8_t *const *out,     \
        Py_ssize_t start, Py_ssize_t stop) {                                                  \
        Py_ssize_t end = start + ((stop - start) & ~(Py_ssize_t)((STEP) - 1));                \
        for (int r0 = 0; r0 < rows; r0 += GROUP) {                                            \
            switch (rows - r0 < GROUP ? rows - r0 : GROUP) {                                  \
                case 1: group_##name(coef, r0, 1, cols, in, out, start, end); break;          \
                case 2: group_##name(coef, r0, 2, cols, in, out, start, end); break;          \
                case 3: group_##name(coef, r0, 3, cols, in, out, start, end); break;          \
                default: group_##name(coef, r0, 4, cols, in, out, start, end); break;         \
            }                                                                                 \
        }                                                                                     \
        return end;                                                                           \
    }

/* A wide kernel: two VEC vectors (2 * WIDTH bytes) of every input per step, each read once for
 * the whole group; per output and input, `PRODUCT(looked-up coefficient, x)` is XORed into that
 * output's accumulators. Each coefficient is looked up (LOOKUP: its nibble table or its affine
 * matrix, of type COEF) once per call, and 0 and 1 are no special case (their lookups give 0
 * and x). LOAD, STORE, ZERO and XOR are the instruction set's, VEC its register type. */
#define WIDE_KERNEL(name, isa, VEC, WIDTH, COEF, LOOKUP, PRODUCT, LOAD, STORE, ZERO, XOR)            \
    __attribute__((target(isa))) INLINE void group_##name(const uint8_t *coef, int r0, const int G,  \
                                                          int cols, uint8_t *const *in,              \
                                                          uint8_t *const *out, Py_ssize_t start,     \
                                                          Py_ssize_t end) {                          \
        COEF looked_up[GROUP * MAX_SHARDS];                                                          \
        for (int g = 0; g < G; g++)                                                                  \
            for (int c = 0; c < cols; c++) looked_up[g * cols + c] = LOOKUP(coef[(r0 + g) * cols + c]); \
        for (Py_ssize_t i = start; i < end; i += 2 * (WIDTH)) {                                      \
            VEC acc_a[GROUP], acc_b[GROUP];                                                          \
            for (int g = 0; g < G; g++) acc_a[g] = acc_b[g] = ZERO();                                \
            for (int c = 0; c < cols; c++) {                                                         \
                VEC xa = LOAD(in[c] + i), xb = LOAD(in[c] + i + (WIDTH));                            \
                for (int g = 0; g < G; g++) {                                                        \
                    acc_a[g] = XOR(acc_a[g], PRODUCT(looked_up[g * cols + c], xa));                  \
                    acc_b[g] = XOR(acc_b[g], PRODUCT(looked_up[g * cols + c], xb));                  \
                }                                                                                    \
            }                                                                                        \
            for (int g = 0; g < G; g++) {                                                            \
                STORE(out[r0 + g] + i, acc_a[g]);                                                    \
                STORE(out[r0 + g] + i + (WIDTH), acc_b[g]);                                          \
            }                                                                                        \
        }                                                                                            \
    }                                                                                                \
    DOT_KERNEL(name, isa, 2 * (WIDTH))

#define NIBBLE_TABLE(k) ((const uint8_t *)nibble_tables[k])
#define AFFINE_MATRIX(k) affine_matrices[k]

__attribute__((target("avx2"))) INLINE __m256i load_256(const uint8_t *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}
__attribute__((target("avx2"))) INLINE void store_256(uint8_t *p, __m256i v) {
    _mm256_storeu_si256((__m256i *)p, v);
}
/* table times each byte of x: table_lo[x & 15] ^ table_hi[x >> 4], one shuffle per half */
__attribute__((target("avx2"))) INLINE __m256i times_table_256(const uint8_t *table, __m256i x) {
    const __m256i low_mask = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_and_si256(x, low_mask);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi64(x, 4), low_mask);
    __m256i t_lo = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)table));
    __m256i t_hi = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(table + 16)));
    return _mm256_xor_si256(_mm256_shuffle_epi8(t_lo, lo), _mm256_shuffle_epi8(t_hi, hi));
}
__attribute__((target("gfni,avx2"))) INLINE __m256i times_matrix_256(uint64_t matrix, __m256i x) {
    return _mm256_gf2p8affine_epi64_epi8(x, _mm256_set1_epi64x((long long)matrix), 0);
}
__attribute__((target("avx512f"))) INLINE __m512i load_512(const uint8_t *p) {
    return _mm512_loadu_si512((const void *)p);
}
__attribute__((target("avx512f"))) INLINE void store_512(uint8_t *p, __m512i v) {
    _mm512_storeu_si512((void *)p, v);
}
__attribute__((target("gfni,avx512f,avx512bw"))) INLINE __m512i times_matrix_512(uint64_t matrix, __m512i x) {
    return _mm512_gf2p8affine_epi64_epi8(x, _mm512_set1_epi64((long long)matrix), 0);
}

WIDE_KERNEL(avx2, "avx2", __m256i, 32, const uint8_t *, NIBBLE_TABLE, times_table_256, load_256,
            store_256, _mm256_setzero_si256, _mm256_xor_si256)
WIDE_KERNEL(gfni_avx2, "gfni,avx2", __m256i, 32, uint64_t, AFFINE_MATRIX, times_matrix_256, load_256,
            store_256, _mm256_setzero_si256, _mm256_xor_si256)
WIDE_KERNEL(gfni_avx512, "gfni,avx512f,avx512bw", __m512i, 64, uint64_t, AFFINE_MATRIX, times_matrix_512,
            load_512, store_512, _mm512_setzero_si512, _mm512_xor_si512)

/* SSSE3: one 16-byte vector per step, coefficients looked up as they come (0 skipped, 1 XORed) */
__attribute__((target("ssse3"))) INLINE void group_ssse3(const uint8_t *coef, int r0, const int G, int cols,
                                                          uint8_t *const *in, uint8_t *const *out,
                                                          Py_ssize_t start, Py_ssize_t end) {
    const __m128i low_mask = _mm_set1_epi8(0x0f);
    for (Py_ssize_t i = start; i < end; i += 16) {
        __m128i acc[GROUP];
        for (int g = 0; g < G; g++) acc[g] = _mm_setzero_si128();
        for (int c = 0; c < cols; c++) {
            __m128i x = _mm_loadu_si128((const __m128i *)(in[c] + i));
            __m128i lo = _mm_and_si128(x, low_mask);
            __m128i hi = _mm_and_si128(_mm_srli_epi64(x, 4), low_mask);
            for (int g = 0; g < G; g++) {
                uint8_t k = coef[(r0 + g) * cols + c];
                if (k == 0) continue;
                if (k == 1) {
                    acc[g] = _mm_xor_si128(acc[g], x);
                    continue;
                }
                __m128i t_lo = _mm_load_si128((const __m128i *)nibble_tables[k]);
                __m128i t_hi = _mm_load_si128((const __m128i *)(nibble_tables[k] + 16));
                acc[g] = _mm_xor_si128(acc[g], _mm_xor_si128(_mm_shuffle_epi8(t_lo, lo), _mm_shuffle_epi8(t_hi, hi)));
            }
        }
        for (int g = 0; g < G; g++) _mm_storeu_si128((__m128i *)(out[r0 + g] + i), acc[g]);
    }
}
DOT_KERNEL(ssse3, "ssse3", 16)
#endif

static void dot_dispatch(const uint8_t *coef, int rows, int cols, uint8_t *const *in,
                         uint8_t *const *out, Py_ssize_t start, Py_ssize_t stop) {
    Py_ssize_t done = start;
#if RC_X86
    if (kernel == GFNI_AVX512)
        done = dot_gfni_avx512(coef, rows, cols, in, out, start, stop);
    else if (kernel == GFNI_AVX2)
        done = dot_gfni_avx2(coef, rows, cols, in, out, start, stop);
    else if (kernel == AVX2)
        done = dot_avx2(coef, rows, cols, in, out, start, stop);
    else if (kernel == SSSE3)
        done = dot_ssse3(coef, rows, cols, in, out, start, stop);
#endif
    if (done < stop) dot_scalar(coef, rows, cols, in, out, done, stop);
}

/* Acquire buffers for a sequence; on failure releases what it took and returns -1. */
static int get_buffers(PyObject *seq, Py_buffer *views, Py_ssize_t count, int writable,
                       const char *what) {
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(item, &views[i], flags) != 0) {
            for (Py_ssize_t j = 0; j < i; j++) PyBuffer_Release(&views[j]);
            PyErr_Format(PyExc_ValueError,
                         "%s[%zd] must be a C-contiguous%s buffer of bytes", what, i,
                         writable ? " writable" : "");
            return -1;
        }
    }
    return 0;
}

/* Each buffer's start, once it is checked to hold at least `stop` bytes; -1 (a ValueError set)
 * if one holds fewer. */
static int get_pointers(const Py_buffer *views, uint8_t **pointers, int count, Py_ssize_t stop,
                        const char *what) {
    for (int i = 0; i < count; i++) {
        if (views[i].len < stop) {
            PyErr_Format(PyExc_ValueError, "%s[%d] holds %zd bytes, fewer than stop=%zd", what, i,
                         views[i].len, stop);
            return -1;
        }
        pointers[i] = (uint8_t *)views[i].buf;
    }
    return 0;
}

static PyObject *py_dot(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer coef_view;
    int rows, cols;
    PyObject *in_obj, *out_obj;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "y*iiOOnn", &coef_view, &rows, &cols, &in_obj, &out_obj, &start,
                          &stop))
        return NULL;
    PyObject *result = NULL, *in_seq = NULL, *out_seq = NULL;
    Py_buffer in_views[MAX_SHARDS], out_views[MAX_SHARDS];
    uint8_t *in_ptrs[MAX_SHARDS], *out_ptrs[MAX_SHARDS];
    int have_in = 0, have_out = 0;

    if (rows < 1 || cols < 1 || rows > MAX_SHARDS || cols > MAX_SHARDS ||
        coef_view.len != (Py_ssize_t)rows * cols) {
        PyErr_SetString(PyExc_ValueError, "coefficients must hold rows*cols bytes, 1..256 each");
        goto done;
    }
    in_seq = PySequence_Fast(in_obj, "inputs must be a sequence of buffers");
    out_seq = PySequence_Fast(out_obj, "outputs must be a sequence of buffers");
    if (!in_seq || !out_seq) goto done;
    if (PySequence_Fast_GET_SIZE(in_seq) != cols || PySequence_Fast_GET_SIZE(out_seq) != rows) {
        PyErr_SetString(PyExc_ValueError, "need exactly cols inputs and rows outputs");
        goto done;
    }
    if (get_buffers(in_seq, in_views, cols, 0, "inputs") != 0) goto done;
    have_in = 1;
    if (get_buffers(out_seq, out_views, rows, 1, "outputs") != 0) goto done;
    have_out = 1;
    if (start < 0 || stop < start) {
        PyErr_SetString(PyExc_ValueError, "need 0 <= start <= stop");
        goto done;
    }
    if (get_pointers(in_views, in_ptrs, cols, stop, "inputs") != 0) goto done;
    if (get_pointers(out_views, out_ptrs, rows, stop, "outputs") != 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    dot_dispatch((const uint8_t *)coef_view.buf, rows, cols, in_ptrs, out_ptrs, start, stop);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    if (have_in)
        for (int c = 0; c < cols; c++) PyBuffer_Release(&in_views[c]);
    if (have_out)
        for (int r = 0; r < rows; r++) PyBuffer_Release(&out_views[r]);
    Py_XDECREF(in_seq);
    Py_XDECREF(out_seq);
    PyBuffer_Release(&coef_view);
    return result;
}

static int runs(int which) {
    return which == SCALAR || (which == SSSE3 && have_ssse3) || (which == AVX2 && have_avx2) ||
           (which == GFNI_AVX2 && have_gfni_avx2) || (which == GFNI_AVX512 && have_gfni_avx512);
}

static PyObject *py_isa(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(kernel_names[kernel]);
}

static PyObject *py_kernels(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    PyObject *names = PyList_New(0);
    for (int which = SCALAR; names && which <= GFNI_AVX512; which++) {
        if (!runs(which)) continue;
        PyObject *name = PyUnicode_FromString(kernel_names[which]);
        if (!name || PyList_Append(names, name) != 0) Py_CLEAR(names);
        Py_XDECREF(name);
    }
    return names;
}

static PyObject *py_use(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    for (int which = SCALAR; which <= GFNI_AVX512; which++)
        if (strcmp(name, kernel_names[which]) == 0 && runs(which)) {
            kernel = which;
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "this CPU does not run the kernel %s; it runs those kernels() lists",
                 name);
    return NULL;
}

static PyMethodDef methods[] = {
    {"dot", py_dot, METH_VARARGS,
     "dot(coefficients, rows, cols, inputs, outputs, start, stop): outputs[r][start:stop] = "
     "sum_c coefficients[r*cols+c] * inputs[c][start:stop] over GF(2^8); releases the GIL."},
    {"isa", py_isa, METH_NOARGS, "The kernel dot runs: the best this CPU runs, unless use() chose another."},
    {"kernels", py_kernels, METH_NOARGS, "The kernels this CPU runs, slowest first."},
    {"use", py_use, METH_VARARGS, "use(name): make dot run that kernel (one kernels() lists)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gf256",
                                    "GF(2^8) shard kernel for ray_ckpt.codec.", -1, methods};

PyMODINIT_FUNC PyInit__gf256(void) {
    init_tables();
#if RC_X86
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
    have_ssse3 = __builtin_cpu_supports("ssse3");
    have_gfni_avx2 = have_avx2 && __builtin_cpu_supports("gfni");
    have_gfni_avx512 = have_gfni_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
    for (int which = SCALAR; which <= GFNI_AVX512; which++)
        if (runs(which)) kernel = which;
    return PyModule_Create(&module);
}
