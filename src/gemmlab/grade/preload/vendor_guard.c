/* vendor_guard: an LD_PRELOAD library that sees every cuBLAS / cuBLASLt GEMM call (and the gemv/dot and cuDNN
 * convolution entry points torch uses) a process makes through ordinary symbol resolution or dlsym, records
 * it where the process's Python cannot take it back, and forwards or refuses it. See __init__.py for what
 * this guarantees and what it does not.
 *
 * Environment, read once in the constructor (before the interpreter, so before any candidate code):
 *   GEMMLAB_VENDOR_LOG     path of a log file, opened O_APPEND at load time (reopened by exec'd children)
 *   GEMMLAB_VENDOR_LOG_FD  an inherited file descriptor (the write end of the grader's pipe) to log to as well
 *   GEMMLAB_VENDOR_COUNTS  path of a counter file, mmap'ed MAP_SHARED at load time (the fd is closed at once)
 *   GEMMLAB_VENDOR_POLICY  "log" (default: record and forward) or "refuse" (record and return
 *                          CUBLAS_STATUS_NOT_SUPPORTED or CUDNN_STATUS_NOT_SUPPORTED;
 *                          the void legacy API skips the call)
 *   GEMMLAB_VENDOR_TOKEN   a secret echoed only in the exit line; overwritten in the environment at load, so
 *                          the process's os.environ and /proc/self/environ no longer show it
 *
 * Log lines (each one write(2), shorter than PIPE_BUF, so lines from several processes never interleave):
 *   loaded <pid> <ppid> policy=<log|refuse>
 *   call <pid> <symbol> <n> <fwd|refused|unresolved>  calls 1..64 of a symbol, then every power of two
 *   lib <pid> <symbol> <path>                          the library the first forwarded call went to
 *   bypass <pid> <symbol> <path>                       dlsym found the symbol in a second copy of cuBLAS
 *   exit <pid> <token> <sym>=<n>,...                   at normal exit (destructor): this process's totals
 *
 * Counter file: "GMLVG001", u64 nsym, u64 lost (log writes that failed), u64 bypasses, nsym names of 48 bytes,
 * nsym u64 call counts, nsym u64 refusal counts; all processes that load the library add to the same file.
 *
 * No CUDA headers: handles and descriptors are void *, enums are int, and each prototype follows
 * cublas_api.h / cublasLt.h (CUDA 12 and 13) and cudnn_graph.h / cudnn_cnn.h (cuDNN 9) so that the forwarded
 * call is ABI-exact. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CUBLAS_STATUS_NOT_INITIALIZED 1
#define CUBLAS_STATUS_NOT_SUPPORTED 15
#define CUDNN_STATUS_NOT_INITIALIZED 1001 /* cuDNN 9 numbering */
#define CUDNN_STATUS_NOT_SUPPORTED 3000

/* Every guarded symbol, once. X(name) */
#define GUARDED(X)                                                                                              \
  X(cublasSgemm_v2) X(cublasDgemm_v2) X(cublasCgemm_v2) X(cublasZgemm_v2) X(cublasHgemm)                       \
  X(cublasCgemm3m) X(cublasZgemm3m)                                                                             \
  X(cublasSgemm_v2_64) X(cublasDgemm_v2_64) X(cublasCgemm_v2_64) X(cublasZgemm_v2_64) X(cublasHgemm_64)        \
  X(cublasCgemm3m_64) X(cublasZgemm3m_64)                                                                       \
  X(cublasSgemmEx) X(cublasCgemmEx) X(cublasCgemm3mEx) X(cublasGemmEx)                                          \
  X(cublasSgemmEx_64) X(cublasCgemmEx_64) X(cublasCgemm3mEx_64) X(cublasGemmEx_64)                              \
  X(cublasSgemmBatched) X(cublasDgemmBatched) X(cublasCgemmBatched) X(cublasZgemmBatched)                       \
  X(cublasHgemmBatched) X(cublasCgemm3mBatched)                                                                 \
  X(cublasSgemmBatched_64) X(cublasDgemmBatched_64) X(cublasCgemmBatched_64) X(cublasZgemmBatched_64)           \
  X(cublasHgemmBatched_64) X(cublasCgemm3mBatched_64)                                                           \
  X(cublasGemmBatchedEx) X(cublasGemmBatchedEx_64)                                                              \
  X(cublasSgemmStridedBatched) X(cublasDgemmStridedBatched) X(cublasCgemmStridedBatched)                        \
  X(cublasZgemmStridedBatched) X(cublasHgemmStridedBatched) X(cublasCgemm3mStridedBatched)                      \
  X(cublasSgemmStridedBatched_64) X(cublasDgemmStridedBatched_64) X(cublasCgemmStridedBatched_64)               \
  X(cublasZgemmStridedBatched_64) X(cublasHgemmStridedBatched_64) X(cublasCgemm3mStridedBatched_64)             \
  X(cublasGemmStridedBatchedEx) X(cublasGemmStridedBatchedEx_64)                                                \
  X(cublasSgemmGroupedBatched) X(cublasDgemmGroupedBatched) X(cublasGemmGroupedBatchedEx)                       \
  X(cublasSgemmGroupedBatched_64) X(cublasDgemmGroupedBatched_64) X(cublasGemmGroupedBatchedEx_64)              \
  X(cublasLtMatmul)                                                                                             \
  X(cublasSgemv_v2) X(cublasDgemv_v2) X(cublasCgemv_v2) X(cublasZgemv_v2)                                       \
  X(cublasSdot_v2) X(cublasDdot_v2) X(cublasCdotu_v2) X(cublasCdotc_v2) X(cublasZdotu_v2) X(cublasZdotc_v2)     \
  X(cublasDotEx)                                                                                                \
  X(cudnnBackendExecute) X(cudnnConvolutionForward)                                                             \
  X(cublasSgemm) X(cublasDgemm) X(cublasCgemm) X(cublasZgemm)

#define AS_ENUM(name) SYM_##name,
#define AS_NAME(name) #name,
enum { GUARDED(AS_ENUM) NSYM };
static const char *const sym_names[NSYM] = {GUARDED(AS_NAME)};

#define NAME_BYTES 48
struct counts_file {
  char magic[8];
  uint64_t nsym, lost, bypassed;
  char names[NSYM][NAME_BYTES];
  uint64_t calls[NSYM], refused[NSYM];
};

static uint64_t local_calls[NSYM]; /* this process's own totals (reset in a forked child) */
static struct counts_file *shared; /* NULL without GEMMLAB_VENDOR_COUNTS */
static int log_fd = -1, pipe_fd = -1, refuse;
static char token[72] = "-";

static void lost_write(void) {
  if (shared) __atomic_fetch_add(&shared->lost, 1, __ATOMIC_RELAXED);
}

static void put(int fd, const char *line, size_t len) {
  if (fd < 0) return;
  ssize_t w;
  do w = write(fd, line, len);
  while (w < 0 && errno == EINTR);
  if (w != (ssize_t)len) lost_write();
}

static void emit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emit(const char *fmt, ...) {
  char line[4096];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (len < 0) return;
  if ((size_t)len >= sizeof line) len = sizeof line - 1, line[len - 1] = '\n';
  int saved = errno; /* a guarded call must not change errno for its caller */
  put(log_fd, line, (size_t)len);
  put(pipe_fd, line, (size_t)len);
  errno = saved;
}

/* Count one call of symbol i; 1: forward it, 0: refuse it. */
static int note(int i) {
  uint64_t n = __atomic_add_fetch(&local_calls[i], 1, __ATOMIC_RELAXED);
  if (shared) __atomic_fetch_add(refuse ? &shared->refused[i] : &shared->calls[i], 1, __ATOMIC_RELAXED);
  if (n <= 64 || (n & (n - 1)) == 0)
    emit("call %d %s %llu %s\n", (int)getpid(), sym_names[i], (unsigned long long)n, refuse ? "refused" : "fwd");
  return !refuse;
}

/* The real dlsym/dlvsym: this library exports its own dlsym (below), so its own lookups must not use it. */
static void *(*real_dlsym)(void *, const char *);
static void *(*real_dlvsym)(void *, const char *, const char *);
static void init_dl(void) {
  if (__atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE)) return;
  static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"}; /* x86-64, aarch64 */
  void *f = NULL, *g = NULL;
  for (int k = 0; k < 3 && !f; k++) f = dlvsym(RTLD_NEXT, "dlsym", versions[k]);
  for (int k = 0; k < 3 && !g; k++) g = dlvsym(RTLD_NEXT, "dlvsym", versions[k]);
  __atomic_store_n(&real_dlvsym, g, __ATOMIC_RELEASE);
  __atomic_store_n(&real_dlsym, f, __ATOMIC_RELEASE);
}

static void *slots[NSYM]; /* the real definition of each symbol, once known: the fallback forward target */

static const char *path_of(void *f) {
  Dl_info info;
  return dladdr(f, &info) && info.dli_fname ? info.dli_fname : "?";
}

static void set_slot(int i, void *f) {
  void *none = NULL;
  if (__atomic_compare_exchange_n(&slots[i], &none, f, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    emit("lib %d %s %s\n", (int)getpid(), sym_names[i], path_of(f));
}

/* Names of the loaded objects, collected first: dlopen is not called under dl_iterate_phdr's lock. */
#define MAX_OBJECTS 1024
struct objects { int n; char *names[MAX_OBJECTS]; };
static int collect(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  struct objects *o = data;
  if (info->dlpi_name && *info->dlpi_name && o->n < MAX_OBJECTS) o->names[o->n++] = strdup(info->dlpi_name);
  return 0;
}

/* A definition of symbol i in any loaded object's own scope, cuBLAS libraries first. */
static void *find_loaded(int i, void *self) {
  struct objects o = {0};
  dl_iterate_phdr(collect, &o);
  void *found = NULL;
  for (int pass = 0; pass < 2 && !found; pass++)
    for (int j = 0; j < o.n && !found; j++) {
      if ((strstr(o.names[j], "cublas") != NULL) != (pass == 0)) continue;
      void *h = dlopen(o.names[j], RTLD_LAZY | RTLD_NOLOAD);
      if (!h) continue;
      void *f = real_dlsym(h, sym_names[i]);
      if (f && f != self) found = f;
      dlclose(h);
    }
  for (int j = 0; j < o.n; j++) free(o.names[j]);
  return found;
}

/* Where a call of symbol i from return address `ret` goes: the definition the caller would have bound to
 * without this library, i.e. the one in the caller's own scope (libtorch_cuda.so -> its libcublas), cached
 * per caller object; else the known definition, the next one in the global scope (dlsym(RTLD_NEXT) only
 * searches that, and Python loads extension modules and their libcublas RTLD_LOCAL), or any loaded one. */
#define CACHE 8
struct binding { void *map, *fn; };
static struct binding bindings[NSYM][CACHE];
static int nbindings[NSYM];
static pthread_mutex_t bind_lock = PTHREAD_MUTEX_INITIALIZER;

/* Symbol i as seen from the object `map` (a struct link_map *): in its own dependency tree. dlsym needs a
 * handle from dlopen, which sets up the object's search list (a link_map that was only loaded as a
 * dependency has none); the main program's handle would be the global scope, which finds the guard. */
static void *scope_lookup(void *map, int i, void *self) {
  const char *name = ((struct link_map *)map)->l_name;
  if (!name || !*name) return NULL;
  void *h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return NULL;
  void *f = real_dlsym(h, sym_names[i]);
  dlclose(h);
  /* The caller's own definition is not where its call goes: a library that calls its own export through a
   * pointer to the guard (a shim that dlsym'ed it) would loop back into itself. */
  struct dl_find_object fo;
  if (f && _dl_find_object(f, &fo) == 0 && fo.dlfo_link_map == map) return NULL;
  return f == self ? NULL : f;
}

static void *forward_target(int i, void *self, void *ret) {
  init_dl();
  struct dl_find_object fo;
  void *map = _dl_find_object(ret, &fo) == 0 ? fo.dlfo_link_map : NULL, *f = NULL;
  int n = __atomic_load_n(&nbindings[i], __ATOMIC_ACQUIRE), cached = 0;
  for (int k = 0; k < n && map && !cached; k++)
    if (bindings[i][k].map == map) f = bindings[i][k].fn, cached = 1;
  if (map && !cached) {
    f = scope_lookup(map, i, self);
    pthread_mutex_lock(&bind_lock);
    if (nbindings[i] < CACHE) {
      bindings[i][nbindings[i]] = (struct binding){map, f};
      __atomic_store_n(&nbindings[i], nbindings[i] + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&bind_lock);
  }
  if (f) {
    set_slot(i, f);
    return f;
  }
  if ((f = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE))) return f;
  f = real_dlsym(RTLD_NEXT, sym_names[i]);
  if (!f || f == self) f = find_loaded(i, self);
  if (!f) {
    emit("call %d %s 0 unresolved\n", (int)getpid(), sym_names[i]);
    return NULL;
  }
  set_slot(i, f);
  return f;
}

/* What a refused (or unresolvable) call returns: cublasStatus_t or cudnnStatus_t. */
static int status(int i, int refused) {
  int cudnn = strncmp(sym_names[i], "cudnn", 5) == 0;
  if (refused) return cudnn ? CUDNN_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_NOT_SUPPORTED;
  return cudnn ? CUDNN_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_NOT_INITIALIZED;
}

/* One guarded entry point returning cublasStatus_t or cudnnStatus_t. PARAMS is the exact prototype, ARGS its names. */
#define GUARD(name, PARAMS, ARGS)                                                                               \
  int name PARAMS {                                                                                             \
    if (!note(SYM_##name)) return status(SYM_##name, 1);                                                        \
    int(*f) PARAMS = (int(*) PARAMS)forward_target(SYM_##name, (void *)name, __builtin_return_address(0));      \
    return f ? f ARGS : status(SYM_##name, 0);                                                                  \
  }
/* The legacy (cublas.h) API returns void; a refused call does nothing. */
#define GUARD_VOID(name, PARAMS, ARGS)                                                                          \
  void name PARAMS {                                                                                            \
    if (!note(SYM_##name)) return;                                                                              \
    void(*f) PARAMS = (void(*) PARAMS)forward_target(SYM_##name, (void *)name, __builtin_return_address(0));    \
    if (f) f ARGS;                                                                                              \
  }

typedef void *H;          /* cublasHandle_t, cublasLt* descriptors, cudaStream_t */
typedef const void *P;    /* device / host pointers of any element type */
typedef const void *const *PP; /* arrays of pointers (batched) */
typedef int64_t L;

/* C = alpha op(A) op(B) + beta C: S/D/C/Z/H gemm, C/Z gemm3m (I = int or int64_t). */
#define GEMM_PARAMS(I) (H h, int ta, int tb, I m, I n, I k, P alpha, P A, I lda, P B, I ldb, P beta, void *C, I ldc)
#define GEMM_ARGS (h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
#define GEMM_FAMILY(X) X(cublasSgemm_v2) X(cublasDgemm_v2) X(cublasCgemm_v2) X(cublasZgemm_v2) X(cublasHgemm) \
  X(cublasCgemm3m) X(cublasZgemm3m)
#define GEMM32(name) GUARD(name, GEMM_PARAMS(int), GEMM_ARGS)
#define GEMM64(name) GUARD(name##_64, GEMM_PARAMS(L), GEMM_ARGS)
GEMM_FAMILY(GEMM32)
GEMM_FAMILY(GEMM64)

/* SgemmEx / CgemmEx / Cgemm3mEx: typed alpha/beta, cudaDataType per operand. */
#define GEMMEX_PARAMS(I) \
  (H h, int ta, int tb, I m, I n, I k, P alpha, P A, int at, I lda, P B, int bt, I ldb, P beta, void *C, int ct, I ldc)
#define GEMMEX_ARGS (h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc)
#define GEMMEX_FAMILY(X) X(cublasSgemmEx) X(cublasCgemmEx) X(cublasCgemm3mEx)
#define GEMMEX32(name) GUARD(name, GEMMEX_PARAMS(int), GEMMEX_ARGS)
#define GEMMEX64(name) GUARD(name##_64, GEMMEX_PARAMS(L), GEMMEX_ARGS)
GEMMEX_FAMILY(GEMMEX32)
GEMMEX_FAMILY(GEMMEX64)

/* GemmEx: as above plus cublasComputeType_t and cublasGemmAlgo_t. */
#define GEMMEXC_PARAMS(I) (H h, int ta, int tb, I m, I n, I k, P alpha, P A, int at, I lda, P B, int bt, I ldb, \
                           P beta, void *C, int ct, I ldc, int compute, int algo)
#define GEMMEXC_ARGS (h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo)
GUARD(cublasGemmEx, GEMMEXC_PARAMS(int), GEMMEXC_ARGS)
GUARD(cublasGemmEx_64, GEMMEXC_PARAMS(L), GEMMEXC_ARGS)

/* <t>gemmBatched: arrays of pointers, one batchCount. */
#define BATCHED_PARAMS(I) \
  (H h, int ta, int tb, I m, I n, I k, P alpha, PP A, I lda, PP B, I ldb, P beta, void *const *C, I ldc, I batch)
#define BATCHED_ARGS (h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, batch)
#define BATCHED_FAMILY(X) X(cublasSgemmBatched) X(cublasDgemmBatched) X(cublasCgemmBatched) X(cublasZgemmBatched) \
  X(cublasHgemmBatched) X(cublasCgemm3mBatched)
#define BATCHED32(name) GUARD(name, BATCHED_PARAMS(int), BATCHED_ARGS)
#define BATCHED64(name) GUARD(name##_64, BATCHED_PARAMS(L), BATCHED_ARGS)
BATCHED_FAMILY(BATCHED32)
BATCHED_FAMILY(BATCHED64)

#define BATCHEDEX_PARAMS(I) (H h, int ta, int tb, I m, I n, I k, P alpha, PP A, int at, I lda, PP B, int bt, I ldb, \
                             P beta, void *const *C, int ct, I ldc, I batch, int compute, int algo)
#define BATCHEDEX_ARGS (h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, batch, compute, algo)
GUARD(cublasGemmBatchedEx, BATCHEDEX_PARAMS(int), BATCHEDEX_ARGS)
GUARD(cublasGemmBatchedEx_64, BATCHEDEX_PARAMS(L), BATCHEDEX_ARGS)

/* <t>gemmStridedBatched: long long strides. */
#define STRIDED_PARAMS(I) (H h, int ta, int tb, I m, I n, I k, P alpha, P A, I lda, long long sa, P B, I ldb, \
                           long long sb, P beta, void *C, I ldc, long long sc, I batch)
#define STRIDED_ARGS (h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch)
#define STRIDED_FAMILY(X) X(cublasSgemmStridedBatched) X(cublasDgemmStridedBatched) X(cublasCgemmStridedBatched) \
  X(cublasZgemmStridedBatched) X(cublasHgemmStridedBatched) X(cublasCgemm3mStridedBatched)
#define STRIDED32(name) GUARD(name, STRIDED_PARAMS(int), STRIDED_ARGS)
#define STRIDED64(name) GUARD(name##_64, STRIDED_PARAMS(L), STRIDED_ARGS)
STRIDED_FAMILY(STRIDED32)
STRIDED_FAMILY(STRIDED64)

#define STRIDEDEX_PARAMS(I) (H h, int ta, int tb, I m, I n, I k, P alpha, P A, int at, I lda, long long sa, P B, \
                             int bt, I ldb, long long sb, P beta, void *C, int ct, I ldc, long long sc, I batch,    \
                             int compute, int algo)
#define STRIDEDEX_ARGS \
  (h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch, compute, algo)
GUARD(cublasGemmStridedBatchedEx, STRIDEDEX_PARAMS(int), STRIDEDEX_ARGS)
GUARD(cublasGemmStridedBatchedEx_64, STRIDEDEX_PARAMS(L), STRIDEDEX_ARGS)

/* Grouped batched (CUDA 12.5+): per-group arrays (host), group_count (int or int64_t). */
#define GROUPED_PARAMS(I) (H h, P ta, P tb, P m, P n, P k, P alpha, PP A, P lda, PP B, P ldb, P beta, \
                           void *const *C, P ldc, I groups, P group_size)
#define GROUPED_ARGS (h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, groups, group_size)
GUARD(cublasSgemmGroupedBatched, GROUPED_PARAMS(int), GROUPED_ARGS)
GUARD(cublasDgemmGroupedBatched, GROUPED_PARAMS(int), GROUPED_ARGS)
GUARD(cublasSgemmGroupedBatched_64, GROUPED_PARAMS(L), GROUPED_ARGS)
GUARD(cublasDgemmGroupedBatched_64, GROUPED_PARAMS(L), GROUPED_ARGS)
#define GROUPEDEX_PARAMS(I) (H h, P ta, P tb, P m, P n, P k, P alpha, PP A, int at, P lda, PP B, int bt, P ldb, \
                             P beta, void *const *C, int ct, P ldc, I groups, P group_size, int compute)
#define GROUPEDEX_ARGS \
  (h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, groups, group_size, compute)
GUARD(cublasGemmGroupedBatchedEx, GROUPEDEX_PARAMS(int), GROUPEDEX_ARGS)
GUARD(cublasGemmGroupedBatchedEx_64, GROUPEDEX_PARAMS(L), GROUPEDEX_ARGS)

/* cublasLtMatmul(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, size, stream) */
GUARD(cublasLtMatmul, (H h, H desc, P alpha, P A, H ad, P B, H bd, P beta, P C, H cd, void *D, H dd, P algo, void *ws,
                       size_t ws_bytes, H stream),
      (h, desc, alpha, A, ad, B, bd, beta, C, cd, D, dd, algo, ws, ws_bytes, stream))

/* BLAS 1/2 entry points torch calls (aten::mv, aten::dot): a GEMM can be built from them. */
#define GEMV_PARAMS (H h, int t, int m, int n, P alpha, P A, int lda, P x, int incx, P beta, void *y, int incy)
#define GEMV_ARGS (h, t, m, n, alpha, A, lda, x, incx, beta, y, incy)
GUARD(cublasSgemv_v2, GEMV_PARAMS, GEMV_ARGS)
GUARD(cublasDgemv_v2, GEMV_PARAMS, GEMV_ARGS)
GUARD(cublasCgemv_v2, GEMV_PARAMS, GEMV_ARGS)
GUARD(cublasZgemv_v2, GEMV_PARAMS, GEMV_ARGS)
#define DOT_PARAMS (H h, int n, P x, int incx, P y, int incy, void *result)
#define DOT_ARGS (h, n, x, incx, y, incy, result)
GUARD(cublasSdot_v2, DOT_PARAMS, DOT_ARGS)
GUARD(cublasDdot_v2, DOT_PARAMS, DOT_ARGS)
GUARD(cublasCdotu_v2, DOT_PARAMS, DOT_ARGS)
GUARD(cublasCdotc_v2, DOT_PARAMS, DOT_ARGS)
GUARD(cublasZdotu_v2, DOT_PARAMS, DOT_ARGS)
GUARD(cublasZdotc_v2, DOT_PARAMS, DOT_ARGS)
GUARD(cublasDotEx, (H h, int n, P x, int xt, int incx, P y, int yt, int incy, void *result, int rt, int exec),
      (h, n, x, xt, incx, y, yt, incy, result, rt, exec))

/* cuDNN: a 1x1 convolution is a GEMM. torch runs convolutions through the backend (graph) API. */
GUARD(cudnnBackendExecute, (H h, H plan, H variant_pack), (h, plan, variant_pack))
GUARD(cudnnConvolutionForward, (H h, P alpha, H xd, P x, H wd, P w, H cd, int algo, void *ws, size_t ws_bytes, P beta,
                                H yd, void *y),
      (h, alpha, xd, x, wd, w, cd, algo, ws, ws_bytes, beta, yd, y))

/* Legacy API: scalars by value. cuComplex is float2 (8-byte aligned), cuDoubleComplex double2 (16). */
typedef struct { float x, y; } __attribute__((aligned(8))) cf;
typedef struct { double x, y; } __attribute__((aligned(16))) zf;
#define LEGACY_PARAMS(T) (char ta, char tb, int m, int n, int k, T alpha, P A, int lda, P B, int ldb, T beta, \
                          void *C, int ldc)
#define LEGACY_ARGS (ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
GUARD_VOID(cublasSgemm, LEGACY_PARAMS(float), LEGACY_ARGS)
GUARD_VOID(cublasDgemm, LEGACY_PARAMS(double), LEGACY_ARGS)
GUARD_VOID(cublasCgemm, LEGACY_PARAMS(cf), LEGACY_ARGS)
GUARD_VOID(cublasZgemm, LEGACY_PARAMS(zf), LEGACY_ARGS)

/* dlsym: a lookup of a guarded name by handle (ctypes.CDLL(libcublas).cublasGemmEx, cffi, a C extension's
 * dlopen+dlsym, RTLD_DEEPBIND) gets the guard, which then forwards to that definition; a lookup that finds a
 * second copy of cuBLAS is recorded as a bypass. Any other name goes straight on to the real dlsym by a tail
 * call, so it still sees its caller (RTLD_NEXT and RTLD_DEFAULT depend on who calls). */
#define AS_FN(name) (void *)name,
static void *const guard_fns[NSYM] = {GUARDED(AS_FN)};

/* Only cuBLAS names: cuDNN 9's libcudnn.so.9 is a shim that dlsym's its own sub-libraries, which must not be
 * taken for a second copy; cuDNN calls are seen through the PLT only. */
static int guarded_index(const char *name) {
  if (!name || strncmp(name, "cublas", 6) != 0) return -1;
  for (int i = 0; i < NSYM; i++)
    if (strcmp(name, sym_names[i]) == 0) return i;
  return -1;
}

static void *guarded_lookup(int i, void *f, void *ret) {
  void *self = guard_fns[i];
  if (f == self) { /* RTLD_DEFAULT finds the guard: answer only if the caller could reach a real one */
    struct dl_find_object fo;
    void *map = _dl_find_object(ret, &fo) == 0 ? fo.dlfo_link_map : NULL;
    void *real = map ? scope_lookup(map, i, self) : NULL;
    if (real) set_slot(i, real);
    return real || __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE) || real_dlsym(RTLD_NEXT, sym_names[i]) ? self : NULL;
  }
  if (!f) return NULL;
  set_slot(i, f); /* no-op once known */
  if (f == __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE)) return self;
  emit("bypass %d %s %s\n", (int)getpid(), sym_names[i], path_of(f));
  if (shared) __atomic_fetch_add(&shared->bypassed, 1, __ATOMIC_RELAXED);
  return refuse ? NULL : f;
}

static void *guard_dlvsym(void *handle, const char *name, const char *version) {
  init_dl();
  int i = guarded_index(name);
  if (i < 0) return real_dlvsym(handle, name, version);
  return guarded_lookup(i, real_dlvsym(handle, name, version), __builtin_return_address(0));
}

void *dlsym(void *handle, const char *name) {
  init_dl();
  int i = guarded_index(name);
  if (i < 0) {
    if (strcmp(name, "dlsym") == 0) return (void *)dlsym;
    if (strcmp(name, "dlvsym") == 0) return (void *)guard_dlvsym;
    return real_dlsym(handle, name);
  }
  return guarded_lookup(i, real_dlsym(handle, name), __builtin_return_address(0));
}

static void after_fork_child(void) { memset(local_calls, 0, sizeof local_calls); }

static void open_counts(const char *path) {
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  if (ftruncate(fd, sizeof(struct counts_file)) == 0) { /* grows a new file with zeros; keeps an existing one */
    void *p = mmap(NULL, sizeof(struct counts_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) shared = p;
  }
  close(fd);
  if (!shared) return;
  for (int i = 0; i < NSYM; i++) strncpy(shared->names[i], sym_names[i], NAME_BYTES - 1);
  shared->nsym = NSYM; /* the same bytes from every process, so concurrent initialisation is harmless */
  memcpy(shared->magic, "GMLVG001", 8);
}

__attribute__((constructor)) static void guard_load(void) {
  const char *v = getenv("GEMMLAB_VENDOR_POLICY");
  refuse = v && strcmp(v, "refuse") == 0;
  if ((v = getenv("GEMMLAB_VENDOR_LOG")) && *v) log_fd = open(v, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if ((v = getenv("GEMMLAB_VENDOR_LOG_FD")) && *v) {
    char *end;
    long fd = strtol(v, &end, 10);
    if (*end == '\0' && fd >= 0 && fcntl((int)fd, F_GETFD) >= 0) {
      pipe_fd = (int)fd;
      fcntl(pipe_fd, F_SETFL, fcntl(pipe_fd, F_GETFL) | O_NONBLOCK); /* a full pipe loses a line, never blocks */
    }
  }
  if ((v = getenv("GEMMLAB_VENDOR_COUNTS")) && *v) open_counts(v);
  char *t = getenv("GEMMLAB_VENDOR_TOKEN");
  if (t && *t) {
    snprintf(token, sizeof token, "%s", t);
    memset(t, 'x', strlen(t)); /* in place: the initial environment block is what /proc/self/environ shows */
  }
  pthread_atfork(NULL, NULL, after_fork_child);
  emit("loaded %d %d policy=%s\n", (int)getpid(), (int)getppid(), refuse ? "refuse" : "log");
}

__attribute__((destructor)) static void guard_exit(void) {
  char line[4096];
  int len = snprintf(line, sizeof line, "exit %d %s ", (int)getpid(), token);
  for (int i = 0; i < NSYM && len < (int)sizeof line - 64; i++)
    if (local_calls[i]) len += snprintf(line + len, sizeof line - len, "%s=%llu,", sym_names[i],
                                        (unsigned long long)local_calls[i]);
  emit("%s\n", line);
}
