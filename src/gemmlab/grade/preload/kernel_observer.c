/* kernel_observer: every kernel a process runs, by name, reported to the grader over a channel that the
 * process's Python cannot fake without a secret. A CUPTI injection library (CUDA_INJECTION64_PATH: the
 * driver loads it at cuInit and calls InitializeInjection), also named in LD_PRELOAD so that its constructor
 * runs before the interpreter. See gemmlab/grade/observer.py for the protocol's other end and for what this
 * guarantees and what it does not.
 *
 * Environment, read once by the constructor (before any candidate code):
 *   GEMMLAB_OBSERVER_SOCK   path of the grader's listening unix socket; connected at load, close-on-exec
 *   GEMMLAB_OBSERVER_TOKEN  32 hex digits: the SipHash key of the blocks' MACs; overwritten in place at load
 *   GEMMLAB_OBSERVER_CUPTI  libcupti to dlopen when the process has not loaded one (torch normally has)
 *
 * What is watched (InitializeInjection, once per process):
 *   activity  CONCURRENT_KERNEL, MEMCPY, MEMSET records: every kernel that ran (graph replays included),
 *             by name, as the device reports it
 *   callbacks the driver's launch entry points (cuLaunchKernel, cuLaunchKernelEx, cooperative, legacy):
 *             the kernel's name at launch; cuGraphLaunch and cudaGraphLaunch: a graph launch, which must be
 *             matched by at least one activity record of its correlation id before the next answer
 *   refusals  the CUPTI control entry points (cuptiActivityDisable, cuptiFinalize, cuptiSubscribe, ...) are
 *             defined here too, so a call that reaches them by ordinary symbol resolution (torch's profiler,
 *             a C extension) is counted and answered CUPTI_SUCCESS without reaching CUPTI
 *
 * The channel: the grader writes "flush <nonce>\n"; a thread here flushes CUPTI until no new record arrives
 * and answers with one block. Blocks are text lines closed by "mac <16 hex>", the SipHash-2-4 of the
 * previous block's MAC (8 bytes, little endian; 0 before the first) followed by the block's bytes:
 *   loaded <pid>                                         the constructor (before the interpreter)
 *   hello <pid> <key>=<value> ... lib=<path>             InitializeInjection: CUPTI's answers (0: success)
 *   epoch <seq> <pid> <nonce>                            an answer to "flush <nonce>", then:
 *     k <ran> <in_graphs> <launched> <name>              per kernel name with any count since the last epoch
 *     r <entry point> <count>                            refused CUPTI calls since the last epoch
 *     n <key>=<value> ...                                totals since the last epoch, and the observer's health
 * Names are truncated to NAME_OUT bytes; bytes outside printable ASCII become '?'. */
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "siphash.h"

#define EXPORT __attribute__((visibility("default")))
#define BUFFER_BYTES (4u << 20)  /* one CUPTI activity buffer */
#define NAMES 8192               /* distinct kernel names a process may run (power of two) */
#define PENDING 4096             /* graph launches waiting for their first activity record */
#define NAME_OUT 2000            /* bytes of a name reported */
#define QUIET_ROUNDS 8           /* flushes until one brings nothing new */

/* ------------------------------------------------------------------------------------------- state */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;  /* everything below */
static int chan = -1;                                     /* the grader's socket */
static uint8_t key[16];
static uint64_t chain;                                    /* the last block's MAC */
static char cupti_path[4096];

struct name { char *s; uint64_t hash, ran, graph, launched; };
static struct name names[NAMES];
static unsigned nnames;
struct pend { uint32_t id[4]; int n; };
static struct pend pend[PENDING];
static int npend;
static struct {
  uint64_t kernels, memcpy, memset, launches, graph_launches, graph_records, records; /* since the last epoch */
  uint64_t dropped, names_lost, pend_lost, buffers_lost, reinit;        /* since the start */
} tally;
static uint64_t seq;
static __thread uint32_t open_graph; /* the runtime's graph launch on this thread, while one is open */

/* The real CUPTI entry points, from the library itself: this library defines the control ones too. */
static struct {
  CUptiResult (*version)(uint32_t *);
  CUptiResult (*register_cb)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*enable)(CUpti_ActivityKind);
  CUptiResult (*flush)(uint32_t);
  CUptiResult (*next)(uint8_t *, size_t, CUpti_Activity **);
  CUptiResult (*dropped)(CUcontext, uint32_t, size_t *);
  CUptiResult (*subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
  CUptiResult (*enable_cb)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
  CUptiResult (*cb_state)(uint32_t *, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
} real;
static CUpti_SubscriberHandle subscriber;

/* ---------------------------------------------------------------------------------- blocks, MAC'd */

struct text { char *p; size_t len, cap; };

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->p && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap ? 2 * t->cap : 4096;
    while (cap < t->len + (size_t)n + 1) cap *= 2;
    char *p = realloc(t->p, cap);
    if (!p) return;
    t->p = p, t->cap = cap;
  }
}

static void put_name(struct text *t, const char *s) {
  size_t n = strnlen(s, NAME_OUT);
  put(t, "%.*s", (int)n, s);
  for (size_t i = t->len - n; i < t->len; i++)
    if ((unsigned char)t->p[i] <= ' ' || (unsigned char)t->p[i] >= 0x7f) t->p[i] = '?';
}

/* A block begins with 8 bytes of room for the previous MAC, which the MAC covers but the channel never
 * carries (the grader has it). Called with the lock held. */
static void begin(struct text *t) {
  put(t, "%8s", "");
}

static void send_block(struct text *t) {
  if (!t->p) return;
  for (int i = 0; i < 8; i++) t->p[i] = (char)(chain >> (8 * i));
  chain = siphash(key, (const uint8_t *)t->p, t->len);
  put(t, "mac %016llx\n", (unsigned long long)chain);
  size_t off = 8;
  while (chan >= 0 && off < t->len) {
    ssize_t w = send(chan, t->p + off, t->len - off, MSG_NOSIGNAL); /* a closed channel is no SIGPIPE */
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += (size_t)w;
  }
  free(t->p);
  t->p = NULL, t->len = t->cap = 0;
}

/* -------------------------------------------------------------------------------- names, launches */

static uint64_t hash_of(const char *s) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

/* The slot of name s (interned on first sight), or NULL when the table is full. Lock held. */
static struct name *intern(const char *s) {
  if (!s) s = "(unnamed)";
  uint64_t h = hash_of(s);
  for (unsigned i = (unsigned)h & (NAMES - 1);; i = (i + 1) & (NAMES - 1)) {
    struct name *e = &names[i];
    if (!e->s) {
      if (nnames >= NAMES * 3 / 4 || !(e->s = strdup(s))) {
        tally.names_lost++;
        return NULL;
      }
      e->hash = h;
      nnames++;
      return e;
    }
    if (e->hash == h && strcmp(e->s, s) == 0) return e;
  }
}

static void pending_add(uint32_t id) {
  if (npend >= PENDING) {
    tally.pend_lost++;
    return;
  }
  pend[npend++] = (struct pend){{id}, 1};
}

static void pending_alias(uint32_t of, uint32_t id) {
  for (int i = npend - 1; i >= 0; i--)
    for (int j = 0; j < pend[i].n; j++)
      if (pend[i].id[j] == of) {
        if (pend[i].n < 4) pend[i].id[pend[i].n++] = id;
        return;
      }
  pending_add(id);
}

static void pending_match(uint32_t id) {
  if (!id) return;
  for (int i = 0; i < npend; i++)
    for (int j = 0; j < pend[i].n; j++)
      if (pend[i].id[j] == id) {
        pend[i] = pend[--npend];
        return;
      }
}

static int is_kernel_launch(CUpti_CallbackId cbid) {
  switch (cbid) {
  case CUPTI_DRIVER_TRACE_CBID_cuLaunch: case CUPTI_DRIVER_TRACE_CBID_cuLaunchGrid:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchGridAsync: case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernelMultiDevice:
    return 1;
  default:
    return 0;
  }
}
/* The launch entry points watched; a failure to enable the legacy and cooperative ones (absent from some
 * drivers) is reported but not fatal, the others (what torch, Triton, cuBLAS and CUTLASS use) must work. */
static const struct { CUpti_CallbackDomain domain; CUpti_CallbackId cbid; int required; } watched[] = {
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, 1},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz, 1},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, 1},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz, 1},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, 1},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz, 1},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000, 1},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000, 1},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel, 0},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz, 0},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernelMultiDevice, 0},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunch, 0},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchGrid, 0},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchGridAsync, 0},
};
#define NWATCHED (sizeof(watched) / sizeof(watched[0]))
static int watching[NWATCHED]; /* enabled at start-up */

/* Launch callbacks: a kernel's name as it is launched; a graph launch's correlation ids (the runtime's and,
 * nested in it, the driver's: an activity record may carry either). */
static void CUPTIAPI on_api(void *ud, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data) {
  (void)ud;
  const CUpti_CallbackData *cd = data;
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    if (cd->callbackSite == CUPTI_API_EXIT) {
      open_graph = 0;
      return;
    }
    pthread_mutex_lock(&lock);
    pending_add(cd->correlationId);
    tally.graph_launches++;
    pthread_mutex_unlock(&lock);
    open_graph = cd->correlationId;
    return;
  }
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || cd->callbackSite != CUPTI_API_ENTER) return;
  pthread_mutex_lock(&lock);
  if (is_kernel_launch(cbid)) {
    struct name *e = intern(cd->symbolName);
    if (e) e->launched++;
    tally.launches++;
  } else if (open_graph) {
    pending_alias(open_graph, cd->correlationId);
  } else {
    pending_add(cd->correlationId);
    tally.graph_launches++;
  }
  pthread_mutex_unlock(&lock);
}

/* ---------------------------------------------------------------------------------------- activity */

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
  *buf = aligned_alloc(8, BUFFER_BYTES);
  *size = *buf ? BUFFER_BYTES : 0;
  *max_records = 0;
  if (!*buf) {
    pthread_mutex_lock(&lock);
    tally.buffers_lost++;
    pthread_mutex_unlock(&lock);
  }
}

/* Records are read at the offsets of CUpti_ActivityKernel10, Memcpy6 and Memset4: later versions of these
 * records add fields at their ends only. */
static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
  (void)size;
  CUpti_Activity *r = NULL;
  pthread_mutex_lock(&lock);
  while (buf && real.next(buf, valid, &r) == CUPTI_SUCCESS) {
    tally.records++;
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const CUpti_ActivityKernel10 *k = (const void *)r;
      struct name *e = intern(k->name);
      tally.kernels++;
      if (e) e->ran++;
      if (k->graphId) {
        if (e) e->graph++;
        tally.graph_records++;
        pending_match(k->correlationId);
      }
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const CUpti_ActivityMemcpy6 *m = (const void *)r;
      tally.memcpy++;
      if (m->graphId) tally.graph_records++, pending_match(m->correlationId), pending_match(m->runtimeCorrelationId);
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const CUpti_ActivityMemset4 *m = (const void *)r;
      tally.memset++;
      if (m->graphId) tally.graph_records++, pending_match(m->correlationId);
    }
  }
  size_t dropped = 0;
  if (real.dropped && real.dropped(ctx, stream, &dropped) == CUPTI_SUCCESS) tally.dropped += dropped;
  pthread_mutex_unlock(&lock);
  free(buf);
}

/* ------------------------------------------------------------------------------- refused entry points */

#define REFUSED(X)                                                                                        \
  X(cuptiActivityRegisterCallbacks) X(cuptiActivityEnable) X(cuptiActivityEnableAndDump)                  \
  X(cuptiActivityDisable) X(cuptiActivityEnableContext) X(cuptiActivityDisableContext) X(cuptiFinalize)    \
  X(cuptiSubscribe) X(cuptiSubscribe_v2) X(cuptiUnsubscribe) X(cuptiEnableCallback) X(cuptiEnableDomain)   \
  X(cuptiEnableAllDomains)
#define AS_ENUM(n) REF_##n,
#define AS_NAME(n) #n,
enum { REFUSED(AS_ENUM) NREF };
static const char *const refused_names[NREF] = {REFUSED(AS_NAME)};
static uint64_t refused[NREF];
static char dummy_subscriber;

static CUptiResult refuse(int i) {
  pthread_mutex_lock(&lock);
  refused[i]++;
  pthread_mutex_unlock(&lock);
  return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc a,
                                                           CUpti_BuffersCallbackCompleteFunc b) {
  (void)a, (void)b;
  return refuse(REF_cuptiActivityRegisterCallbacks);
}
EXPORT CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind k) { (void)k; return refuse(REF_cuptiActivityEnable); }
EXPORT CUptiResult CUPTIAPI cuptiActivityEnableAndDump(CUpti_ActivityKind k) {
  (void)k;
  return refuse(REF_cuptiActivityEnableAndDump);
}
EXPORT CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind k) { (void)k; return refuse(REF_cuptiActivityDisable); }
EXPORT CUptiResult CUPTIAPI cuptiActivityEnableContext(CUcontext c, CUpti_ActivityKind k) {
  (void)c, (void)k;
  return refuse(REF_cuptiActivityEnableContext);
}
EXPORT CUptiResult CUPTIAPI cuptiActivityDisableContext(CUcontext c, CUpti_ActivityKind k) {
  (void)c, (void)k;
  return refuse(REF_cuptiActivityDisableContext);
}
EXPORT CUptiResult CUPTIAPI cuptiFinalize(void) { return refuse(REF_cuptiFinalize); }
EXPORT CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *s, CUpti_CallbackFunc f, void *u) {
  (void)f, (void)u;
  if (s) *s = (CUpti_SubscriberHandle)&dummy_subscriber;
  return refuse(REF_cuptiSubscribe);
}
EXPORT CUptiResult CUPTIAPI cuptiSubscribe_v2(CUpti_SubscriberHandle *s, CUpti_CallbackFunc f, void *u,
                                              CUpti_SubscriberParams *p) {
  (void)f, (void)u, (void)p;
  if (s) *s = (CUpti_SubscriberHandle)&dummy_subscriber;
  return refuse(REF_cuptiSubscribe_v2);
}
EXPORT CUptiResult CUPTIAPI cuptiUnsubscribe(CUpti_SubscriberHandle s) { (void)s; return refuse(REF_cuptiUnsubscribe); }
EXPORT CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t on, CUpti_SubscriberHandle s, CUpti_CallbackDomain d,
                                                CUpti_CallbackId c) {
  (void)on, (void)s, (void)d, (void)c;
  return refuse(REF_cuptiEnableCallback);
}
EXPORT CUptiResult CUPTIAPI cuptiEnableDomain(uint32_t on, CUpti_SubscriberHandle s, CUpti_CallbackDomain d) {
  (void)on, (void)s, (void)d;
  return refuse(REF_cuptiEnableDomain);
}
EXPORT CUptiResult CUPTIAPI cuptiEnableAllDomains(uint32_t on, CUpti_SubscriberHandle s) {
  (void)on, (void)s;
  return refuse(REF_cuptiEnableAllDomains);
}

/* ------------------------------------------------------------------------------------------ answers */

/* CUPTI's answer to the last flush (-1: no CUPTI). */
static int flush_until_quiet(void) {
  int rc = -1;
  for (int round = 0; round < QUIET_ROUNDS && real.flush; round++) {
    pthread_mutex_lock(&lock);
    uint64_t before = tally.records;
    int waiting = npend > 0;
    pthread_mutex_unlock(&lock);
    rc = real.flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&lock);
    int quiet = tally.records == before && !(waiting && npend > 0);
    pthread_mutex_unlock(&lock);
    if (quiet && round > 0) break;
    if (!quiet) usleep(500);
  }
  return rc;
}

/* 1 when every launch callback this library enabled is still enabled. */
static int callbacks_on(void) {
  if (!real.cb_state || !subscriber) return 0;
  for (size_t i = 0; i < NWATCHED; i++) {
    uint32_t on = 0;
    if (watching[i] && (real.cb_state(&on, subscriber, watched[i].domain, watched[i].cbid) != CUPTI_SUCCESS || !on))
      return 0;
  }
  return 1;
}

static void answer(const char *nonce) {
  char clean[33];
  size_t n = 0;
  for (; nonce[n] && n < 32; n++) clean[n] = strchr("0123456789abcdef", nonce[n]) ? nonce[n] : '?';
  clean[n] = 0;
  int flush_rc = flush_until_quiet();
  int cb = callbacks_on();
  struct text t = {0};
  pthread_mutex_lock(&lock);
  begin(&t);
  put(&t, "epoch %llu %d %s\n", (unsigned long long)++seq, (int)getpid(), clean);
  for (unsigned i = 0; i < NAMES; i++) {
    struct name *e = &names[i];
    if (e->s && (e->ran || e->launched)) {
      put(&t, "k %llu %llu %llu ", (unsigned long long)e->ran, (unsigned long long)e->graph,
          (unsigned long long)e->launched);
      put_name(&t, e->s);
      put(&t, "\n");
      e->ran = e->graph = e->launched = 0;
    }
  }
  for (int i = 0; i < NREF; i++)
    if (refused[i]) put(&t, "r %s %llu\n", refused_names[i], (unsigned long long)refused[i]), refused[i] = 0;
  put(&t, "n kernels=%llu memcpy=%llu memset=%llu launches=%llu graph_launches=%llu graph_records=%llu "
          "unmatched=%d dropped=%llu "
          "names_lost=%llu pending_lost=%llu buffers_lost=%llu reinit=%llu callbacks=%d flush=%d\n",
      (unsigned long long)tally.kernels, (unsigned long long)tally.memcpy, (unsigned long long)tally.memset,
      (unsigned long long)tally.launches, (unsigned long long)tally.graph_launches,
      (unsigned long long)tally.graph_records, npend,
      (unsigned long long)tally.dropped, (unsigned long long)tally.names_lost, (unsigned long long)tally.pend_lost,
      (unsigned long long)tally.buffers_lost, (unsigned long long)tally.reinit, cb, flush_rc);
  tally.kernels = tally.memcpy = tally.memset = tally.launches = tally.graph_launches = tally.graph_records = 0;
  send_block(&t);
  pthread_mutex_unlock(&lock);
}

/* The grader's requests, one line each; anything but "flush <hex>" is ignored. */
static void *serve(void *arg) {
  (void)arg;
  char line[128];
  size_t have = 0;
  for (;;) {
    ssize_t r = read(chan, line + have, sizeof line - 1 - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return NULL;
    have += (size_t)r;
    char *nl;
    while ((nl = memchr(line, '\n', have))) {
      *nl = 0;
      if (strncmp(line, "flush ", 6) == 0) answer(line + 6);
      size_t used = (size_t)(nl + 1 - line);
      memmove(line, nl + 1, have - used);
      have -= used;
    }
    if (have == sizeof line - 1) have = 0;
  }
}

/* ---------------------------------------------------------------------------------------- start-up */

static void *cupti_handle(void) {
  void *h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD); /* the copy torch loaded */
  if (!h) h = dlopen("libcupti.so.12", RTLD_NOW | RTLD_NOLOAD);
  if (!h && cupti_path[0]) h = dlopen(cupti_path, RTLD_NOW);
  if (!h) h = dlopen("libcupti.so.13", RTLD_NOW);
  return h;
}

EXPORT int InitializeInjection(void) {
  static int started;
  pthread_mutex_lock(&lock);
  if (started) { /* the driver calls this once; a second call comes from someone else */
    tally.reinit++;
    pthread_mutex_unlock(&lock);
    return 1;
  }
  started = 1;
  pthread_mutex_unlock(&lock);
  struct text t = {0};
  void *h = cupti_handle();
  int rc_version = -1, rc_register = -1, rc_kernel = -1, rc_memcpy = -1, rc_memset = -1, rc_subscribe = -1;
  int rc_callbacks = -1;
  uint32_t version = 0;
  if (h) {
    *(void **)&real.version = dlsym(h, "cuptiGetVersion");
    *(void **)&real.register_cb = dlsym(h, "cuptiActivityRegisterCallbacks");
    *(void **)&real.enable = dlsym(h, "cuptiActivityEnable");
    *(void **)&real.flush = dlsym(h, "cuptiActivityFlushAll");
    *(void **)&real.next = dlsym(h, "cuptiActivityGetNextRecord");
    *(void **)&real.dropped = dlsym(h, "cuptiActivityGetNumDroppedRecords");
    *(void **)&real.subscribe = dlsym(h, "cuptiSubscribe");
    *(void **)&real.enable_cb = dlsym(h, "cuptiEnableCallback");
    *(void **)&real.cb_state = dlsym(h, "cuptiGetCallbackState");
  }
  if (real.version) rc_version = real.version(&version);
  if (real.register_cb && real.next) rc_register = real.register_cb(buffer_requested, buffer_completed);
  if (real.enable) {
    rc_kernel = real.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    rc_memcpy = real.enable(CUPTI_ACTIVITY_KIND_MEMCPY);
    rc_memset = real.enable(CUPTI_ACTIVITY_KIND_MEMSET);
  }
  if (real.subscribe) rc_subscribe = real.subscribe(&subscriber, on_api, NULL);
  int optional_off = 0;
  if (rc_subscribe == CUPTI_SUCCESS && real.enable_cb) {
    rc_callbacks = 0;
    for (size_t i = 0; i < NWATCHED; i++) {
      int rc = real.enable_cb(1, subscriber, watched[i].domain, watched[i].cbid);
      watching[i] = rc == CUPTI_SUCCESS;
      if (rc != CUPTI_SUCCESS && watched[i].required) rc_callbacks = rc;
      optional_off += rc != CUPTI_SUCCESS && !watched[i].required;
    }
  }
  pthread_mutex_lock(&lock);
  begin(&t);
  put(&t, "hello %d cupti=%u version=%d register=%d kernel=%d memcpy=%d memset=%d subscribe=%d callbacks=%d "
          "optional_off=%d lib=", (int)getpid(), version, rc_version, rc_register, rc_kernel, rc_memcpy, rc_memset,
      rc_subscribe, rc_callbacks, optional_off);
  Dl_info where = {0};
  put_name(&t, h && real.flush && dladdr((void *)real.flush, &where) && where.dli_fname ? where.dli_fname
                                                                                     : "(no libcupti)");
  put(&t, "\n");
  send_block(&t);
  pthread_mutex_unlock(&lock);
  pthread_t thread;
  if (chan >= 0 && pthread_create(&thread, NULL, serve, NULL) == 0) pthread_detach(thread);
  return 1;
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

__attribute__((constructor)) static void observer_load(void) {
  char *tok = getenv("GEMMLAB_OBSERVER_TOKEN");
  if (tok && strlen(tok) >= 32) {
    for (int i = 0; i < 16; i++) {
      int hi = hexval(tok[2 * i]), lo = hexval(tok[2 * i + 1]);
      key[i] = (uint8_t)((hi < 0 ? 0 : hi) << 4 | (lo < 0 ? 0 : lo));
    }
  }
  if (tok) memset(tok, 'x', strlen(tok)); /* in place: what /proc/self/environ shows */
  const char *lib = getenv("GEMMLAB_OBSERVER_CUPTI");
  if (lib) snprintf(cupti_path, sizeof cupti_path, "%s", lib);
  const char *path = getenv("GEMMLAB_OBSERVER_SOCK");
  if (!path || !*path) return;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) return;
  strcpy(addr.sun_path, path);
  /* Non-blocking connect: every process that inherits the environment (the compiler and ptxas that Triton
   * runs, say) loads this library too; once the listener's queue is full a blocking connect would wait until
   * the grader accepts, which it does only after the request in flight, so the compile would never end. Such
   * a process goes unconnected instead; the sandbox's own process connected first, at its exec. */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return;
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    close(fd);
    return;
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    close(fd);
    return;
  }
  chan = fd;
  struct text t = {0};
  pthread_mutex_lock(&lock);
  begin(&t);
  put(&t, "loaded %d\n", (int)getpid());
  send_block(&t);
  pthread_mutex_unlock(&lock);
}
