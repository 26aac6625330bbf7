/* pyggml's own C helpers (declared in pyggml.h): compiled into the cffi extension after the
   ggml headers, before the generated trampolines of the backend modules. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-impl.h" /* struct ggml_cgraph (internal: copied into pyggml/include by the build) */

struct pyggml_dl_entry { const char *name; const char *module; void **slot; };
/* defined after this file: the functions of the backend modules, generated from their headers
   (pyggml_build.declarations.dl_trampolines), or empty */
extern struct pyggml_dl_entry pyggml_dl_table[];

__attribute__((unused)) static void pyggml_dl_missing(const char *name, const char *module) {
    fprintf(stderr, "pyggml: %s() called, but ggml has not loaded the %s backend module\n", name, module);
    abort();
}
/* Fill the pointers of `module`'s functions from `path`, if ggml has loaded that file
   (RTLD_NOLOAD: nothing new is loaded). Returns the number bound, or -1 if it is not loaded. */
int pyggml_dl_bind(const char *module, const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) return -1;
    int n = 0;
    for (struct pyggml_dl_entry *e = pyggml_dl_table; e->name; e++) {
        if (strcmp(e->module, module) != 0) continue;
        void *f = dlsym(h, e->name);
        if (f) { *e->slot = f; n++; }
    }
    dlclose(h); /* drops only the reference taken above: ggml's handle keeps it loaded */
    return n;
}

void pyggml_dl_unbind(const char *module) {
    for (struct pyggml_dl_entry *e = pyggml_dl_table; e->name; e++)
        if (strcmp(e->module, module) == 0) *e->slot = NULL;
}

int pyggml_dl_is_bound(const char *name) {
    for (struct pyggml_dl_entry *e = pyggml_dl_table; e->name; e++)
        if (strcmp(e->name, name) == 0) return *e->slot != NULL;
    return -1;
}

/* The first n nodes of `graph` (n = ggml_graph_n_nodes) and their sources, 1 + GGML_MAX_SRC
   pointers per node, into `out`; returns n, or -1 if `capacity` pointers do not hold them.
   A scheduler rewrites the sources of the nodes it splits (to read its copies of a split's
   inputs), and a backend's graph_optimize (Vulkan's, CUDA's) reorders the nodes of a split in
   the graph's own array: the nodes are saved with their sources so that both come back. */
int pyggml_graph_save_srcs(struct ggml_cgraph *graph, struct ggml_tensor **out, int capacity) {
    int n = ggml_graph_n_nodes(graph);
    const int w = 1 + GGML_MAX_SRC;
    if (n * w > capacity) return -1;
    for (int i = 0; i < n; i++) {
        struct ggml_tensor *node = ggml_graph_node(graph, i);
        out[i * w] = node;
        for (int j = 0; j < GGML_MAX_SRC; j++) out[i * w + 1 + j] = node->src[j];
    }
    return n;
}

/* Write back what pyggml_graph_save_srcs saved: each saved node's sources (into the node
   itself, wherever it is now), and with `order` the saved order of the first n_nodes nodes
   (give it only when the graph still holds those nodes, reordered at most). */
void pyggml_graph_restore_srcs(struct ggml_cgraph *graph, struct ggml_tensor **saved, int n_nodes, int order) {
    const int w = 1 + GGML_MAX_SRC;
    struct ggml_tensor **nodes = ggml_graph_nodes(graph);
    if (order && n_nodes > ggml_graph_n_nodes(graph)) order = 0;
    for (int i = 0; i < n_nodes; i++) {
        struct ggml_tensor *node = saved[i * w];
        for (int j = 0; j < GGML_MAX_SRC; j++) node->src[j] = saved[i * w + 1 + j];
        if (order) nodes[i] = node;
    }
}

/* --- the memory of a graph's tensors (pyggml.backend, pyggml.alloc, pyggml.sched). These
   helpers read tensor structs and compare buffer pointers; they never dereference a buffer,
   which may have been freed: that is what they find out. */
struct pyggml_live_buffer { ggml_backend_buffer_t buffer; uintptr_t base; size_t size; };

static ggml_backend_buffer_t pyggml_buffer_of(const struct ggml_tensor *t) {
    return t->view_src ? t->view_src->buffer : t->buffer;
}

/* The distinct buffers (view_src's for views) of every node and source of `graph`, into `out`;
   returns how many, or -1 if more than `capacity`. */
int pyggml_graph_buffers(struct ggml_cgraph *graph, ggml_backend_buffer_t *out, int capacity) {
    int n = 0, n_nodes = ggml_graph_n_nodes(graph);
    for (int i = 0; i < n_nodes; i++) {
        struct ggml_tensor *node = ggml_graph_node(graph, i);
        for (int j = -1; j < GGML_MAX_SRC; j++) {
            const struct ggml_tensor *t = j < 0 ? node : node->src[j];
            if (!t) continue;
            ggml_backend_buffer_t b = pyggml_buffer_of(t);
            if (!b) continue;
            int k = 0;
            while (k < n && out[k] != b) k++;
            if (k < n) continue;
            if (n == capacity) return -1;
            out[n++] = b;
        }
    }
    return n;
}

/* Check every node and source of `graph`: if it is in a backend buffer, that buffer must be one
   of `live` and its data inside it; with `need_data`, every tensor must also have data (a view:
   its source's). Returns 0 if all pass, else 1 (no data), 2 (a buffer that is not live) or
   3 (data outside its buffer), with the tensor in *bad and the node that reads it in *node. */
int pyggml_graph_check_memory(struct ggml_cgraph *graph, const struct pyggml_live_buffer *live, int n_live,
                              int need_data, struct ggml_tensor **bad, struct ggml_tensor **node) {
    int n_nodes = ggml_graph_n_nodes(graph);
    for (int i = 0; i < n_nodes; i++) {
        struct ggml_tensor *nd = ggml_graph_node(graph, i);
        for (int j = -1; j < GGML_MAX_SRC; j++) {
            struct ggml_tensor *t = j < 0 ? nd : nd->src[j];
            if (!t) continue;
            *bad = t; *node = nd;
            ggml_backend_buffer_t b = pyggml_buffer_of(t);
            if (!t->data) {
                /* to compute, every tensor needs data, views too: a view made before its source
                   had data keeps NULL until an allocator inits it (ggml_backend_view_init); but
                   a source whose buffer was freed is the error to report first (2 below) */
                if (need_data && !(t->view_src && t->view_src->data && b)) return 1;
                if (!(t->view_src && t->view_src->data)) continue;
            }
            if (!b) continue;  /* context memory */
            int k = 0;
            while (k < n_live && live[k].buffer != b) k++;
            if (k == n_live) return 2;
            uintptr_t d = (uintptr_t) (t->data ? t->data : t->view_src->data);
            if (d < live[k].base || d > live[k].base + live[k].size) return 3;
            if (!t->data && need_data) return 1;  /* its source is live: the view has no data */
        }
    }
    *bad = NULL; *node = NULL;
    return 0;
}

/* Stand-ins for freed buffers (pyggml.buffer.retire): the tensors of a context that pointed at a
   buffer being freed point at one of these instead, so that a new buffer malloc puts at the same
   address (struct and data) does not make them look placed in it. pyggml never records them as
   live (using such a tensor raises ClosedError); ggml may still ask them their name, type,
   alignment or size, and their data functions do nothing. */
static const char *pyggml_freed_buft_name(ggml_backend_buffer_type_t buft) { (void) buft; return "freed"; }
static ggml_backend_buffer_t pyggml_freed_buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    (void) buft; (void) size; return NULL;
}
static size_t pyggml_freed_buft_alignment(ggml_backend_buffer_type_t buft) { (void) buft; return 1; }
static void pyggml_freed_memset(ggml_backend_buffer_t b, struct ggml_tensor *t, uint8_t v, size_t o, size_t n) {
    (void) b; (void) t; (void) v; (void) o; (void) n;
}
static void pyggml_freed_set(ggml_backend_buffer_t b, struct ggml_tensor *t, const void *d, size_t o, size_t n) {
    (void) b; (void) t; (void) d; (void) o; (void) n;
}
static void pyggml_freed_get(ggml_backend_buffer_t b, const struct ggml_tensor *t, void *d, size_t o, size_t n) {
    (void) b; (void) t; (void) d; (void) o; (void) n;
}
static void pyggml_freed_clear(ggml_backend_buffer_t b, uint8_t v) { (void) b; (void) v; }
static struct ggml_backend_buffer_type pyggml_freed_buft = {
    .iface = { .get_name = pyggml_freed_buft_name, .alloc_buffer = pyggml_freed_buft_alloc,
               .get_alignment = pyggml_freed_buft_alignment },
    .device = NULL, .context = NULL,
};
#define PYGGML_FREED_BUFFER { \
    .iface = { .memset_tensor = pyggml_freed_memset, .set_tensor = pyggml_freed_set, \
               .get_tensor = pyggml_freed_get, .clear = pyggml_freed_clear }, \
    .buft = &pyggml_freed_buft, .context = NULL, .size = 0, .usage = GGML_BACKEND_BUFFER_USAGE_ANY }
/* [0]: a user's buffer; [1]: a graph allocator's or scheduler's (its tensors may be placed again) */
static struct ggml_backend_buffer pyggml_freed_buffers[2] = { PYGGML_FREED_BUFFER, PYGGML_FREED_BUFFER };

ggml_backend_buffer_t pyggml_freed_buffer(int by_placer) { return &pyggml_freed_buffers[by_placer ? 1 : 0]; }

/* Point the tensors of `ctx` that are in `buffer` (views too) at `freed`. Returns how many. */
int pyggml_ctx_forget_buffer(struct ggml_context *ctx, ggml_backend_buffer_t buffer, ggml_backend_buffer_t freed) {
    int n = 0;
    for (struct ggml_tensor *t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (t->buffer == buffer) { t->buffer = freed; n++; }
    }
    return n;
}

/* Forget where the tensors of `graph` that sit in one of `buffers` were placed: data and buffer
   set to NULL (for views too), so that an allocator places them again. Returns how many. */
int pyggml_graph_unplace(struct ggml_cgraph *graph, ggml_backend_buffer_t *buffers, int n_buffers) {
    int n = 0, n_nodes = ggml_graph_n_nodes(graph);
    for (int pass = 0; pass < 2; pass++) {  /* views first, while their source still says where it is */
        for (int i = 0; i < n_nodes; i++) {
            struct ggml_tensor *nd = ggml_graph_node(graph, i);
            for (int j = -1; j < GGML_MAX_SRC; j++) {
                struct ggml_tensor *t = j < 0 ? nd : nd->src[j];
                if (!t || (pass == 0) != (t->view_src != NULL)) continue;
                ggml_backend_buffer_t b = pyggml_buffer_of(t);
                if (!b) continue;
                for (int k = 0; k < n_buffers; k++) {
                    if (buffers[k] == b) {
                        t->data = NULL; t->buffer = NULL; n++;
                        break;
                    }
                }
            }
        }
    }
    return n;
}

struct pyggml_abort_throttle { ggml_abort_callback callback; void *data; int64_t interval_us; int64_t last_us; };

/* An abort callback (ggml_abort_callback; data: a struct pyggml_abort_throttle) that asks
   `callback` at most once per `interval_us` microseconds and answers false in between: the CPU
   backend asks its abort callback after every node, and a Python callback costs a GIL round
   trip each time. */
bool pyggml_abort_throttled(void *throttle) {
    struct pyggml_abort_throttle *t = (struct pyggml_abort_throttle *) throttle;
    int64_t now = ggml_time_us();
    if (now - t->last_us < t->interval_us) return false;
    t->last_us = now;
    return t->callback(t->data);
}

/* Row indices that ggml's CPU kernels read from data and only assert on (get_rows, set_rows)
   or do not check at all (get_rows_back writes, mul_mat_id reads): every element of the I32 or
   I64 tensor idx[k] must be in [0, bound[k]). A tensor without data, or whose buffer is not in
   host memory, is skipped. Returns -1 if all are in range, else the k of the first that is not,
   with the offending value in *value. */
int pyggml_check_indices(struct ggml_tensor **idx, const int64_t *bound, int n, int64_t *value) {
    for (int k = 0; k < n; k++) {
        const struct ggml_tensor *t = idx[k];
        ggml_backend_buffer_t b = pyggml_buffer_of(t);
        if (!t->data || (b && !ggml_backend_buffer_is_host(b))) continue;
        const int i64 = t->type == GGML_TYPE_I64;
        for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
        for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
            const char *row = (const char *) t->data + i1*t->nb[1] + i2*t->nb[2] + i3*t->nb[3];
            for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                const char *e = row + i0*t->nb[0];
                int64_t v = i64 ? *(const int64_t *) e : (int64_t) *(const int32_t *) e;
                if (v < 0 || v >= bound[k]) { *value = v; return k; }
            }
        }
    }
    return -1;
}

/* a backend's or a scheduler's compute, called through one pointer type: their first argument,
   a pointer, is passed as a void * is on every ABI ggml supports */
typedef enum ggml_status (*pyggml_compute_fn)(void *obj, struct ggml_cgraph *graph);

static int64_t compute_ns;  /* summed over the process: pyggml_compute_ns */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One compute, one call into C: fn(obj, graph) (ggml_backend_graph_compute,
   ggml_backend_sched_graph_compute or their _async forms) after pyggml_check_indices(idx, bound,
   n, &bad[1]) when n > 0 (bad unused otherwise). bad[0] = -1 and fn's status; or, with nothing
   computed, bad[0] = the k of the first index tensor out of range, bad[1] its value, and
   GGML_STATUS_FAILED. The time inside fn is added to pyggml_compute_ns. */
enum ggml_status pyggml_compute(pyggml_compute_fn fn, void *obj, struct ggml_cgraph *graph,
                                struct ggml_tensor **idx, const int64_t *bound, int n, int64_t *bad) {
    if (n > 0 && (bad[0] = pyggml_check_indices(idx, bound, n, &bad[1])) >= 0) return GGML_STATUS_FAILED;
    const int64_t t0 = now_ns();
    const enum ggml_status status = fn(obj, graph);
    __atomic_fetch_add(&compute_ns, now_ns() - t0, __ATOMIC_RELAXED);
    return status;
}

/* Nanoseconds spent inside ggml's compute calls made through pyggml_compute, summed over the
   process and its threads (what benchmarks subtract from a step's wall time). */
int64_t pyggml_compute_ns(void) {
    return __atomic_load_n(&compute_ns, __ATOMIC_RELAXED);
}

/* Why `path` cannot be loaded (dlerror's message), or NULL if it can. */
const char *pyggml_dl_open_error(const char *path) {
    static __thread char buf[1024];
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h) { dlclose(h); return NULL; }
    const char *err = dlerror();
    snprintf(buf, sizeof buf, "%s", err ? err : "unknown dlopen error");
    return buf;
}

/* ggml's identifier of a graph (ggml-impl.h): ggml-cuda replays a captured CUDA graph without
   comparing nodes while a split's uid stays the same; the scheduler gives every split a new one
   each time it splits a graph. 0: not set. */
uint64_t pyggml_graph_uid(const struct ggml_cgraph *graph) {
    return graph->uid;
}
