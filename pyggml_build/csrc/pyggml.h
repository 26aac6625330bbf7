/* pyggml's own C helpers, compiled into the extension in every build and declared to cffi
   (read by pyggml_build/declarations.py: this file is the cdef, comments are stripped).

   Backend modules (a build without modules binds none): pyggml_dl_*. A graph's node sources
   saved and restored around a scheduler's split, which rewrites them (pyggml.sched); the live
   memory of a graph's tensors; row indices checked before a compute; a compute with those
   checks, timed; the throttled abort callback of the CPU backend; a graph's uid (ggml_cgraph is
   opaque in ggml.h). */
int pyggml_dl_bind(const char *module, const char *path);
void pyggml_dl_unbind(const char *module);
int pyggml_dl_is_bound(const char *name);
const char *pyggml_dl_open_error(const char *path);
int pyggml_graph_save_srcs(struct ggml_cgraph *graph, struct ggml_tensor **out, int capacity);
void pyggml_graph_restore_srcs(struct ggml_cgraph *graph, struct ggml_tensor **saved, int n_nodes, int order);
struct pyggml_live_buffer { ggml_backend_buffer_t buffer; uintptr_t base; size_t size; };
int pyggml_graph_buffers(struct ggml_cgraph *graph, ggml_backend_buffer_t *out, int capacity);
int pyggml_graph_check_memory(struct ggml_cgraph *graph, const struct pyggml_live_buffer *live, int n_live,
                              int need_data, struct ggml_tensor **bad, struct ggml_tensor **node);
int pyggml_graph_unplace(struct ggml_cgraph *graph, ggml_backend_buffer_t *buffers, int n_buffers);
ggml_backend_buffer_t pyggml_freed_buffer(int by_placer);
int pyggml_ctx_forget_buffer(struct ggml_context *ctx, ggml_backend_buffer_t buffer, ggml_backend_buffer_t freed);
int pyggml_check_indices(struct ggml_tensor **idx, const int64_t *bound, int n, int64_t *value);
typedef enum ggml_status (*pyggml_compute_fn)(void *obj, struct ggml_cgraph *graph);
enum ggml_status pyggml_compute(pyggml_compute_fn fn, void *obj, struct ggml_cgraph *graph,
                                struct ggml_tensor **idx, const int64_t *bound, int n, int64_t *bad);
int64_t pyggml_compute_ns(void);
struct pyggml_abort_throttle { ggml_abort_callback callback; void *data; int64_t interval_us; int64_t last_us; };
bool pyggml_abort_throttled(void *throttle);
uint64_t pyggml_graph_uid(const struct ggml_cgraph *graph);
