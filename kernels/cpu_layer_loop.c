/* A Llama decoder stack's layers for one step on the CPU, layer after layer, in C: the loop of
 * `CpuFusedForward.forward` (services/gpu_worker/platforms/cpu_fused_forward.py). Pre-norm
 * layers (Llama's: x + attn(norm(x)), then + mlp(norm(.))), or post-norm ones (OLMo 2's and
 * EXAONE 4's: x + norm(attn(x)), then + norm(mlp(.))), as the shape says.
 *
 * Every op of a layer is already a C kernel (RMSNorm with its residual add, the packed
 * products, the fused SwiGLU, rotary, the KV write, paged attention). Called from Python they
 * were nine ctypes calls a layer, 270 a step of SmolLM2-135M's 30 layers, each paying argument
 * conversion and the interpreter while the other OpenMP thread spins: measured, ~0.3 ms of a
 * one-sequence bf16 decode step (9.1 ms) and ~1.3 ms at 64 sequences (69 ms).
 * Here the same kernels are called in the same order with the same arguments, through the
 * function pointers the caller gives (each kernel stays its own library, built with its own
 * flags), so a step computes the same bits; the loop itself needs no ISA flags and no OpenMP.
 *
 * The caller fills four structs (the kernels, the shape and the weights once a model; the
 * caches' pointers and the step's buffers each step):
 *   layer_kernels   the kernels (AMX: a product for gate-and-up and silu_and_mul in place of
 *                   the fused SwiGLU, swiglu NULL)
 *   layer_shape     the model's widths, heads and dtype, pre- or post-norm layers, q/k norms
 *                   of each head (Qwen3, EXAONE 4) or of the whole projection (OLMo 2)
 *   layer_weights   one per layer: its packed weights, the attention's biases if it has them
 *                   (added in the products, before their one rounding, as the modules add
 *                   them), the attention branch's and the MLP branch's norm weights and
 *                   epsilons (before each branch, or after it), q/k norm weights (normed in
 *                   the qkv rows before rotary), whether it rotates (SmolLM3's NoPE layers do
 *                   not), its caches
 *   step_buffers    the step's rows, angles, slots, working buffers and the attention
 *                   kernel's arguments
 * The layers read x from `hidden` at the first layer and from `out` after; they leave the last
 * layer's output in `out` and, pre-norm, its residual sum in `residual` (the final norm is the
 * caller's: of out + residual, or post-norm of out alone).
 *
 * Only some rows' outputs are used (those the step samples from: a prompt chunk's last token,
 * decodes, drafts; none of a chunk that does not end its prompt), and a row's output is its own
 * (every op but attention is row by row, and attention reads the other rows only through the
 * cache). Given `keep_rows`, the last layer computes every row up to attention (each row's keys
 * and values are cached, and attention runs as for all rows, so a kept row's bits are the
 * same), then only the kept rows: the o product, the norm, the MLP, ~85% of a layer. A
 * 512-token prompt step of SmolLM2-135M's 30 layers saves ~2.8% of its multiply-adds. The kept
 * rows' outputs and residual sums are then rows 0..num_keep of `out` and `residual`.
 *
 * Returns 0, or (nothing more computed) LOOP_NORM_TOO_WIDE where the RMSNorm kernel refused
 * the hidden size, LOOP_SLOT_PAST_CACHE where a slot is not below a layer's num_slots,
 * LOOP_NO_SCRATCH where the attention kernel could not allocate its scratch.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { LOOP_OK = 0, LOOP_NORM_TOO_WIDE = 1, LOOP_SLOT_PAST_CACHE = 2, LOOP_NO_SCRATCH = 3 };

/* y = x W^T (+ bias): small_gemm, small_gemm_amx, small_sgemm */
typedef void (*product_fn)(const void *x, int64_t m, int64_t k, int64_t x_stride,
                           const void *packed, int64_t n, const void *bias, void *y,
                           int64_t y_stride);
/* silu(x Wg^T) * (x Wu^T): small_gemm_swiglu, small_sgemm_swiglu */
typedef void (*swiglu_fn)(const void *x, int64_t m, int64_t k, int64_t x_stride,
                          const void *packed, int64_t n_inter, void *y, int64_t y_stride);
typedef void (*silu_and_mul_fn)(const void *x, int64_t m, int64_t n_inter, int64_t x_stride,
                                void *y, int64_t y_stride);
typedef int (*norm_fn)(const void *x, const void *residual, void *sum_out, void *out,
                       const void *weight, int64_t rows, int64_t hidden, float eps, int is_bf16);
typedef int (*norm_add_fn)(const void *x, const void *residual, void *out, const void *weight,
                           int64_t rows, int64_t hidden, float eps, int is_bf16);
typedef int (*norm_heads_fn)(void *x, int64_t rows, int64_t row_stride, int64_t heads,
                             int64_t head_dim, const void *weight, float eps, int is_bf16);
typedef void (*rotate_fn)(void *x, int64_t tokens, int64_t heads, int64_t head_dim,
                          int64_t row_stride, const float *cos, const float *sin, int is_bf16);
typedef int (*write_kv_fn)(const char *key, const char *value, int64_t src_stride,
                           char *k_cache, char *v_cache, int64_t num_slots, const int64_t *slots,
                           int64_t num_tokens, int64_t row_elems, int64_t elem_bytes);
typedef int (*attend_fn)(void *out, const void *q, int64_t q_row_stride, const void *k_cache,
                         const void *v_cache, const int32_t *block_tables, int64_t max_blocks,
                         const int32_t *seq_lens, const int32_t *query_start,
                         const int32_t *seqs, int64_t num_seqs, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                         float scale, int is_bf16);

typedef struct {
    product_fn qkv_product, o_product, down_product; /* by K: hidden, attention, intermediate */
    product_fn gate_up_product;                      /* where swiglu is NULL */
    swiglu_fn swiglu;
    silu_and_mul_fn silu_and_mul;
    norm_fn norm;
    norm_add_fn norm_add;     /* rms_norm_add: residual + norm(x), for post-norm layers */
    norm_heads_fn norm_heads; /* rms_norm_heads, for layers with q/k norms */
    rotate_fn rotate;
    write_kv_fn write_kv;
    attend_fn attend;
} layer_kernels;

typedef struct {
    int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size;
    int64_t element_bytes;
    float scale;
    int32_t is_bf16;
    int32_t post_norms;    /* 1: OLMo 2's layers, a norm after each branch; 0: Llama's, before */
    int32_t qk_norm_whole; /* 1: q/k norms over the whole projection (OLMo 2); 0: each head */
} layer_shape;

typedef struct {
    const void *attention_norm, *mlp_norm; /* the branches' norms: before them, or after */
    const void *qkv, *o, *gate_up, *down;
    const void *qkv_bias, *o_bias; /* NULL: none (Qwen2: q/k/v only; Llama's attention_bias) */
    const void *q_norm, *k_norm;   /* NULL: none; else an RMSNorm weight [head_dim] each
                                      (Qwen3), or of the projection's width (OLMo 2) */
    void *k_cache, *v_cache;
    int64_t num_slots;
    float attention_eps, mlp_eps, head_norm_eps;
    int32_t rotates; /* 0: no position embedding (SmolLM3's NoPE layers): no rotary */
} layer_weights;

typedef struct {
    int64_t num_tokens;
    void *hidden;
    const float *cos, *sin;
    const int64_t *slots;
    void *normed, *residual, *out, *qkv, *attended, *act, *gate_up;
    const int32_t *block_tables;
    int64_t max_blocks;
    const int32_t *seq_lens, *query_start, *seqs;
    int64_t num_seqs;
    const int64_t *keep_rows; /* NULL: every row; else the rows whose output the caller uses */
    int64_t num_keep;         /* ascending, distinct */
} step_buffers;

/* silu(x Wg^T) * (x Wu^T) of the first `rows` rows of x into b->act: fused, or (AMX) the
 * product, then silu_and_mul. */
static void mlp_up(const layer_kernels *k, const layer_shape *s, const layer_weights *w,
                   const step_buffers *b, const void *x, int64_t rows) {
    const int64_t hidden = s->hidden, inter = s->intermediate;
    if (k->swiglu != NULL) {
        k->swiglu(x, rows, hidden, hidden, w->gate_up, inter, b->act, inter);
        return;
    }
    k->gate_up_product(x, rows, hidden, hidden, w->gate_up, 2 * inter, NULL, b->gate_up,
                       2 * inter);
    k->silu_and_mul(b->gate_up, rows, inter, 2 * inter, b->act, inter);
}

/* Queries and keys normed head by head where the layer has q/k norms, rotated where it
 * rotates; keys and values written; then the queries attended, into b->attended. */
static int attention(const layer_kernels *k, const layer_shape *s, const layer_weights *w,
                     const step_buffers *b) {
    const int64_t rows = b->num_tokens, width = (s->num_heads + 2 * s->num_kv_heads) * s->head_dim;
    const int64_t kv_row = s->num_kv_heads * s->head_dim;
    char *key = (char *)b->qkv + s->num_heads * s->head_dim * s->element_bytes;
    char *value = key + kv_row * s->element_bytes;
    /* q/k norms of each head, or of the whole projection: one "head" of every head's width */
    const int whole = s->qk_norm_whole;
    const int64_t q_heads = whole ? 1 : s->num_heads, k_heads = whole ? 1 : s->num_kv_heads;
    const int64_t q_dim = whole ? s->num_heads * s->head_dim : s->head_dim;
    const int64_t k_dim = whole ? kv_row : s->head_dim;
    if (w->q_norm != NULL &&
        (k->norm_heads(b->qkv, rows, width, q_heads, q_dim, w->q_norm, w->head_norm_eps,
                       s->is_bf16) ||
         k->norm_heads(key, rows, width, k_heads, k_dim, w->k_norm, w->head_norm_eps,
                       s->is_bf16)))
        return LOOP_NORM_TOO_WIDE;
    if (w->rotates)
        k->rotate(b->qkv, rows, s->num_heads + s->num_kv_heads, s->head_dim, width, b->cos,
                  b->sin, s->is_bf16);
    if (k->write_kv(key, value, width, w->k_cache, w->v_cache, w->num_slots, b->slots, rows,
                    kv_row, s->element_bytes))
        return LOOP_SLOT_PAST_CACHE;
    if (k->attend(b->attended, b->qkv, width, w->k_cache, w->v_cache, b->block_tables,
                  b->max_blocks, b->seq_lens, b->query_start, b->seqs, b->num_seqs, s->num_heads,
                  s->num_kv_heads, s->head_dim, s->block_size, s->scale, s->is_bf16))
        return LOOP_NO_SCRATCH;
    return LOOP_OK;
}

/* Rows keep[0..n) of a [rows, width] buffer moved to its first n rows (keep ascending, so
 * keep[j] >= j: each row is read before any later move writes over it); from `src` into `dst`
 * where the two differ. */
static void compact_rows(void *dst, const void *src, const int64_t *keep, int64_t n,
                         int64_t width, int64_t element_bytes) {
    const size_t row_bytes = (size_t)(width * element_bytes);
    for (int64_t j = 0; j < n; j++)
        if (dst != src || keep[j] != j)
            memmove((char *)dst + j * row_bytes, (const char *)src + keep[j] * row_bytes,
                    row_bytes);
}

/* The last layer past attention keeps only the rows of b->keep_rows: their attended rows,
 * and their rows of x (the branch's residual), moved to the front of b->attended and of
 * `front` (which may be x itself). Returns how many rows are left. */
static int64_t keep_rows_only(const layer_shape *s, const step_buffers *b, const void **x,
                              void *front) {
    compact_rows(b->attended, b->attended, b->keep_rows, b->num_keep,
                 s->num_heads * s->head_dim, s->element_bytes);
    compact_rows(front, *x, b->keep_rows, b->num_keep, s->hidden, s->element_bytes);
    *x = front;
    return b->num_keep;
}

/* The qkv product of `input`, then attention into b->attended. */
static int attention_branch(const layer_kernels *k, const layer_shape *s,
                            const layer_weights *w, const step_buffers *b, const void *input) {
    const int64_t width = (s->num_heads + 2 * s->num_kv_heads) * s->head_dim;
    k->qkv_product(input, b->num_tokens, s->hidden, s->hidden, w->qkv, width, w->qkv_bias, b->qkv,
                   width);
    return attention(k, s, w, b);
}

/* b->attended's first `rows` rows times o into `out`. */
static void o_product(const layer_kernels *k, const layer_shape *s, const layer_weights *w,
                      const step_buffers *b, int64_t rows, void *out) {
    const int64_t attention_width = s->num_heads * s->head_dim;
    k->o_product(b->attended, rows, attention_width, attention_width, w->o, s->hidden, w->o_bias,
                 out, s->hidden);
}

/* A pre-norm layer: x (+ residual) -> normed, the sum the next residual (x itself at layer 0,
 * where residual is NULL); its output in b->out, its residual sum in b->residual. `last`: the
 * rows of b->keep_rows only past attention (every row's keys and values are written; no other
 * row of the last layer's output is read), moved to the front of b->out and b->residual. */
static int pre_norm_layer(const layer_kernels *k, const layer_shape *s, const layer_weights *w,
                          const step_buffers *b, const void *x, const void *residual, int last) {
    int64_t rows = b->num_tokens;
    const int64_t hidden = s->hidden;
    if (k->norm(x, residual, b->residual, b->normed, w->attention_norm, rows, hidden,
                w->attention_eps, s->is_bf16))
        return LOOP_NORM_TOO_WIDE;
    const void *x_residual = residual != NULL ? b->residual : x;
    const int status = attention_branch(k, s, w, b, b->normed);
    if (status != LOOP_OK) return status;
    if (last && b->keep_rows != NULL) {
        rows = keep_rows_only(s, b, &x_residual, b->residual);
        if (rows == 0) return LOOP_OK; /* no row's output is used: nothing more to compute */
    }
    o_product(k, s, w, b, rows, b->out);
    if (k->norm(b->out, x_residual, b->residual, b->normed, w->mlp_norm, rows, hidden,
                w->mlp_eps, s->is_bf16))
        return LOOP_NORM_TOO_WIDE;
    mlp_up(k, s, w, b, b->normed, rows);
    k->down_product(b->act, rows, s->intermediate, s->intermediate, w->down, hidden, NULL, b->out,
                    hidden);
    return LOOP_OK;
}

/* A post-norm layer: h = x + norm(attn(x)) into b->residual, then its output
 * h + norm(mlp(h)) into b->out (b->normed holds each branch's output before its norm). `last`:
 * the rows of b->keep_rows only past attention, moved to the front of b->out. */
static int post_norm_layer(const layer_kernels *k, const layer_shape *s,
                           const layer_weights *w, const step_buffers *b, const void *x,
                           int last) {
    int64_t rows = b->num_tokens;
    const int64_t hidden = s->hidden;
    const int status = attention_branch(k, s, w, b, x);
    if (status != LOOP_OK) return status;
    if (last && b->keep_rows != NULL) {
        rows = keep_rows_only(s, b, &x, b->out);
        if (rows == 0) return LOOP_OK;
    }
    o_product(k, s, w, b, rows, b->normed);
    if (k->norm_add(b->normed, x, b->residual, w->attention_norm, rows, hidden, w->attention_eps,
                    s->is_bf16))
        return LOOP_NORM_TOO_WIDE;
    mlp_up(k, s, w, b, b->residual, rows);
    k->down_product(b->act, rows, s->intermediate, s->intermediate, w->down, hidden, NULL,
                    b->normed, hidden);
    if (k->norm_add(b->normed, b->residual, b->out, w->mlp_norm, rows, hidden, w->mlp_eps,
                    s->is_bf16))
        return LOOP_NORM_TOO_WIDE;
    return LOOP_OK;
}

int run_decoder_layers(const void *kernels, const void *shape, const void *weights,
                       int64_t num_layers, const void *buffers) {
    const layer_kernels *k = (const layer_kernels *)kernels;
    const layer_shape *s = (const layer_shape *)shape;
    const layer_weights *w = (const layer_weights *)weights;
    const step_buffers *b = (const step_buffers *)buffers;
    for (int64_t i = 0; i < num_layers; i++) {
        const void *x = i == 0 ? b->hidden : b->out;
        const int last = i == num_layers - 1;
        const int status = s->post_norms
                               ? post_norm_layer(k, s, w + i, b, x, last)
                               : pre_norm_layer(k, s, w + i, b, x, i == 0 ? NULL : b->residual,
                                                last);
        if (status != LOOP_OK) return status;
    }
    return LOOP_OK;
}

/* The structs' sizes, for the caller to check its mirrors against: layer_kernels,
 * layer_shape, layer_weights, step_buffers. */
void layer_loop_struct_sizes(int64_t *sizes) {
    sizes[0] = (int64_t)sizeof(layer_kernels);
    sizes[1] = (int64_t)sizeof(layer_shape);
    sizes[2] = (int64_t)sizeof(layer_weights);
    sizes[3] = (int64_t)sizeof(step_buffers);
}
