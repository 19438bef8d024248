/* The decoding step's small ops in C, for serve/c_decode.py (its docstring has the equations).

   Activations and the KV cache are bfloat16 (the quantized model's dtype); every sum runs in
   float32, in an order fixed by the row's own data: the lanes of a sum are fixed by the index of
   what is summed and the lanes are added in a fixed tree, so a row's bits do not depend on the
   other rows of its batch, or on how many there are. Only decode_attention uses a second thread
   (for two rows or more), and a row stays whole on one thread. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define LANES 16

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* round to nearest even, as torch rounds a float32 to bfloat16 (no NaN reaches here) */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* the LANES partial sums of a sum, added in a fixed tree */
static inline float tree_sum(float *acc) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* Σ_i x[i] in lanes by i mod LANES (n a multiple of LANES or not) */
static float sum_f32(const float *x, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[i + l];
    for (int l = 0; i + l < n; l++) acc[l] += x[i + l];
    return tree_sum(acc);
}

/* x ← bf16(x + delta) (delta may be NULL), then out = bf16(w ⊙ bf16(x / sqrt(mean(x²) + eps))):
   the residual add and the RMSNorm after it, for each of `rows` rows of `hidden` values. */
void add_rms_norm(uint16_t *x, const uint16_t *delta, const uint16_t *w, uint16_t *out,
                  int64_t rows, int64_t hidden, float eps, float *scratch) {
    for (int64_t b = 0; b < rows; b++) {
        uint16_t *xb = x + b * hidden, *ob = out + b * hidden;
        for (int64_t i = 0; i < hidden; i++) {
            float v = bf16_to_f32(xb[i]);
            if (delta) v = bf16_to_f32(f32_to_bf16(v + bf16_to_f32(delta[b * hidden + i])));
            xb[i] = f32_to_bf16(v);
            scratch[i] = v * v;
        }
        float inv = 1.0f / sqrtf(sum_f32(scratch, hidden) / (float)hidden + eps);
        for (int64_t i = 0; i < hidden; i++) {
            float normed = bf16_to_f32(f32_to_bf16(bf16_to_f32(xb[i]) * inv));
            ob[i] = f32_to_bf16(bf16_to_f32(w[i]) * normed);
        }
    }
}

/* 16 floats as one value (gcc's and clang's vector extensions: AVX-512, two AVX registers, or
   four SSE ones, as the machine has), and the same for their bits */
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

static inline v16 load_bf16(const uint16_t *p) {
    v16h h;
    memcpy(&h, p, sizeof h);
    return (v16)(__builtin_convertvector(h, v16u) << 16);
}

/* the 16 lanes of a added in a fixed tree: halves, then quarters, ... */
static inline float lanes_sum(v16 a) {
    v8 b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7)
         + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
    return (c[0] + c[2]) + (c[1] + c[3]);
}

static inline v16 splat(float x) { return (v16){0} + x; }

static inline v16 max16(v16 a, v16 b) {
    v16i take_a = a > b;
    return (v16)(((v16i)a & take_a) | ((v16i)b & ~take_a));
}

/* e^x on 16 lanes for x clamped to [-87, 88]: 2^n · p(r), n = round(x / ln 2) (by adding and
   taking away 1.5·2²³), r = x − n·ln 2 with ln 2 in two parts, p Taylor's series to r⁶ (|r| <=
   ln2/2: relative error about 2e-7) */
static inline v16 exp16(v16 x) {
    const v16 magic = splat(12582912.0f);
    x = max16(x, splat(-87.0f));
    x = -max16(-x, splat(-88.0f));
    v16 n = (x * 1.44269504f + magic) - magic;
    v16 r = x - n * 0.693145751953125f - n * 1.428606765330187e-6f;
    v16 p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120
                    + r * (1.0f / 720))))));
    v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
    return p * (v16)bits;
}

/* out = bf16(silu(g) · u) for [g | u] the two halves of each row of gate_up (rows, 2·inter):
   16 at a time, then one at a time (the same formula on each lane) */
void silu_mul(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inter) {
    for (int64_t b = 0; b < rows; b++) {
        const uint16_t *g = gate_up + b * 2 * inter, *u = g + inter;
        int64_t i = 0;
        for (; i + 16 <= inter; i += 16) {
            v16 x = load_bf16(g + i), y = x / (1.0f + exp16(-x)) * load_bf16(u + i);
            for (int l = 0; l < 16; l++) out[b * inter + i + l] = f32_to_bf16(y[l]);
        }
        for (; i < inter; i++) {
            v16 x = splat(bf16_to_f32(g[i])), y = x / (1.0f + exp16(-x)) * bf16_to_f32(u[i]);
            out[b * inter + i] = f32_to_bf16(y[0]);
        }
    }
}

/* One decoding step's attention for `rows` rows, each with one new token at slot pos[b]:
     [q | k] ← RoPE([q | k]) at pos[b] (rotate-half, cos/sin (rows, d/2) float32), rounded to bf16
     K[b, h, pos[b]], V[b, h, pos[b]] ← k_h, v_h
     o_head = Σ_{s <= pos[b]} softmax_s(q·K_s / √d) V_s        query head = h·group + g
   qkv (rows, (n_h + 2·n_kv)·d) bf16; K, V (rows, n_kv, max_len, d) bf16; o (rows, n_h·d) bf16;
   d a multiple of 16. scratch: ATTENTION_SCRATCH(group, d, max_len) floats, 64-byte aligned. */
#define ATTENTION_SCRATCH(group, d, max_len) ((group) * ((max_len) + 15) + (group) * (d))

/* one row's attention (inlined where it is called with d known, so that its sums stay in
   registers) */
static inline __attribute__((always_inline)) void attend_row(
        const uint16_t *row, const float *c, const float *s, uint16_t *K, uint16_t *V, int64_t p,
        uint16_t *o, int64_t n_h, int64_t n_kv, int64_t d, int64_t max_len, float *scratch) {
    const int64_t group = n_h / n_kv, half = d / 2, n = p + 1, blocks = d / 16;
    const int64_t stride = (max_len + 15) / 16 * 16;            /* a head's scores, in lanes */
    const float scale = 1.0f / sqrtf((float)d);
    float *scores = scratch, *q = scratch + group * stride;
    for (int64_t h = 0; h < n_kv; h++) {
        uint16_t *Kh = K + h * max_len * d, *Vh = V + h * max_len * d;
        /* this step's key (roped) and value into their slot */
        const uint16_t *k = row + (n_h + h) * d, *v = row + (n_h + n_kv + h) * d;
        for (int64_t i = 0; i < half; i++) {
            float x1 = bf16_to_f32(k[i]), x2 = bf16_to_f32(k[i + half]);
            Kh[p * d + i] = f32_to_bf16(x1 * c[i] - x2 * s[i]);
            Kh[p * d + i + half] = f32_to_bf16(x2 * c[i] + x1 * s[i]);
        }
        memcpy(Vh + p * d, v, (size_t)d * 2);
        /* the group's query heads, roped and rounded as the keys */
        for (int64_t g = 0; g < group; g++) {
            const uint16_t *qh = row + (h * group + g) * d;
            for (int64_t i = 0; i < half; i++) {
                float x1 = bf16_to_f32(qh[i]), x2 = bf16_to_f32(qh[i + half]);
                q[g * d + i] = bf16_to_f32(f32_to_bf16(x1 * c[i] - x2 * s[i])) * scale;
                q[g * d + i + half] = bf16_to_f32(f32_to_bf16(x2 * c[i] + x1 * s[i])) * scale;
            }
        }
        /* scores q·K_j/√d: each key read once for the group's heads, lanes by dimension */
        for (int64_t j = 0; j < n; j++) {
            v16 key[blocks];
            for (int64_t i = 0; i < blocks; i++) key[i] = load_bf16(Kh + j * d + 16 * i);
            for (int64_t g = 0; g < group; g++) {
                v16 lane = {0}, qi;
                for (int64_t i = 0; i < blocks; i++) {
                    memcpy(&qi, q + g * d + 16 * i, sizeof qi);
                    lane += qi * key[i];
                }
                scores[g * stride + j] = lanes_sum(lane);
            }
        }
        /* softmax: the max, then e^(score − max) in lanes of 16 keys (the tail's lanes after
           the last key set to 0), their sum in lanes by key mod 16 */
        for (int64_t g = 0; g < group; g++) {
            float *sg = scores + g * stride;
            for (int64_t j = n; j < (n + 15) / 16 * 16; j++) sg[j] = -INFINITY;
            v16 top = splat(-INFINITY), total = {0}, x;
            for (int64_t j = 0; j < n; j += 16) {
                memcpy(&x, sg + j, sizeof x);
                top = max16(top, x);
            }
            float m = top[0];
            for (int l = 1; l < 16; l++) m = fmaxf(m, top[l]);
            for (int64_t j = 0; j < n; j += 16) {
                memcpy(&x, sg + j, sizeof x);
                v16 e = exp16(x - m);
                if (j + 16 > n)
                    for (int64_t l = n - j; l < 16; l++) e[l] = 0.0f;
                memcpy(sg + j, &e, sizeof e);
                total += e;
            }
            q[g * d] = 1.0f / lanes_sum(total);   /* kept where the query was: read no more */
        }
        /* o = Σ_j e_j V_j / Σ e, a head at a time (its sums in registers), lanes by dimension */
        for (int64_t g = 0; g < group; g++) {
            v16 sum[blocks];
            for (int64_t i = 0; i < blocks; i++) sum[i] = splat(0.0f);
            const float *sg = scores + g * stride;
            for (int64_t j = 0; j < n; j++) {
                const v16 e = splat(sg[j]);
                for (int64_t i = 0; i < blocks; i++) sum[i] += e * load_bf16(Vh + j * d + 16 * i);
            }
            uint16_t *oh = o + (h * group + g) * d;
            const float inv = q[g * d];
            for (int64_t i = 0; i < blocks; i++)
                for (int l = 0; l < 16; l++) oh[16 * i + l] = f32_to_bf16(sum[i][l] * inv);
        }
    }
}

struct attention_job {
    const uint16_t *qkv;
    const float *cos, *sin;
    uint16_t *K, *V, *o;
    const int64_t *pos;
    int64_t first, last, n_h, n_kv, d, max_len;
    float *scratch;
};

static void *attend_rows(void *argument) {
    const struct attention_job *a = argument;
    const int64_t width = (a->n_h + 2 * a->n_kv) * a->d, half = a->d / 2;
    for (int64_t b = a->first; b < a->last; b++)
        if (a->d == 64)            /* the usual widths with d known: sums held in registers */
            attend_row(a->qkv + b * width, a->cos + b * half, a->sin + b * half,
                       a->K + b * a->n_kv * a->max_len * 64, a->V + b * a->n_kv * a->max_len * 64,
                       a->pos[b], a->o + b * a->n_h * 64, a->n_h, a->n_kv, 64, a->max_len,
                       a->scratch);
        else if (a->d == 128)
            attend_row(a->qkv + b * width, a->cos + b * half, a->sin + b * half,
                       a->K + b * a->n_kv * a->max_len * 128,
                       a->V + b * a->n_kv * a->max_len * 128, a->pos[b], a->o + b * a->n_h * 128,
                       a->n_h, a->n_kv, 128, a->max_len, a->scratch);
        else
            attend_row(a->qkv + b * width, a->cos + b * half, a->sin + b * half,
                       a->K + b * a->n_kv * a->max_len * a->d,
                       a->V + b * a->n_kv * a->max_len * a->d, a->pos[b],
                       a->o + b * a->n_h * a->d, a->n_h, a->n_kv, a->d, a->max_len, a->scratch);
    return NULL;
}

/* Rows split in two halves over two threads when asked (threads 2) and there are two rows or
   more: a row is computed whole by one thread, in the same order, so its bits are those it has
   alone. scratch: two ATTENTION_SCRATCH blocks. */
void decode_attention(const uint16_t *qkv, const float *cos, const float *sin, uint16_t *K,
                      uint16_t *V, const int64_t *pos, uint16_t *o, int64_t rows, int64_t n_h,
                      int64_t n_kv, int64_t d, int64_t max_len, float *scratch, int64_t threads) {
    const int64_t block = (ATTENTION_SCRATCH(n_h / n_kv, d, max_len) + 15) / 16 * 16;
    struct attention_job all = {qkv, cos, sin, K, V, o, pos, 0, rows, n_h, n_kv, d, max_len,
                                scratch};
    if (threads < 2 || rows < 2) {
        attend_rows(&all);
        return;
    }
    struct attention_job first = all, second = all;
    first.last = second.first = rows / 2;
    second.scratch = scratch + block;
    pthread_t worker;
    if (pthread_create(&worker, NULL, attend_rows, &second) != 0) {
        attend_rows(&all);                  /* no thread: the same rows, the same bits */
        return;
    }
    attend_rows(&first);
    pthread_join(worker, NULL);
}

/* floats of scratch decode_attention needs */
int64_t decode_attention_scratch(int64_t group, int64_t d, int64_t max_len) {
    return 2 * ((ATTENTION_SCRATCH(group, d, max_len) + 15) / 16 * 16);
}
