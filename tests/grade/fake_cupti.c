/* A fake libcupti (SONAME libcupti.so.13) for tests/grade/test_observer.py: the CUPTI entry points that
 * kernel_observer.c uses, with the real headers' types and record layouts, and fake_* functions that play
 * the driver: a kernel launch (a launch callback, then an activity record), a graph launch (the runtime's and
 * the driver's callbacks, then a record of one of their correlation ids), a copy. Records wait until
 * cuptiActivityFlushAll hands them over in one buffer, as CUPTI does. The control entry points here
 * (cuptiActivityDisable, cuptiFinalize, ...) are what a candidate reaches through dlsym on this library. */
#include <cupti.h>
#include <stdlib.h>
#include <string.h>

#define SLOT 512 /* bytes per record in a buffer (every record type fits) */
#define MAXREC 4096

static CUpti_BuffersCallbackRequestFunc requested;
static CUpti_BuffersCallbackCompleteFunc completed;
static CUpti_CallbackFunc callback;
static void *userdata;
static int subscribed, kinds[64], cbs[8][1024];
static uint32_t corr;
static unsigned char records[MAXREC][SLOT];
static int nrec;
static size_t dropped;

CUptiResult cuptiGetVersion(uint32_t *v) { *v = 130001; return CUPTI_SUCCESS; }
CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc r, CUpti_BuffersCallbackCompleteFunc c) {
  requested = r, completed = c;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityEnable(CUpti_ActivityKind k) { kinds[k] = 1; return CUPTI_SUCCESS; }
CUptiResult cuptiActivityDisable(CUpti_ActivityKind k) { kinds[k] = 0; return CUPTI_SUCCESS; }
CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *s, CUpti_CallbackFunc f, void *u) {
  if (subscribed) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  subscribed = 1, callback = f, userdata = u;
  *s = (CUpti_SubscriberHandle)&subscribed;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiEnableCallback(uint32_t on, CUpti_SubscriberHandle s, CUpti_CallbackDomain d, CUpti_CallbackId id) {
  if (s != (CUpti_SubscriberHandle)&subscribed || !subscribed || d >= 8 || id >= 1024) return CUPTI_ERROR_INVALID_PARAMETER;
  cbs[d][id] = (int)on;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiGetCallbackState(uint32_t *on, CUpti_SubscriberHandle s, CUpti_CallbackDomain d, CUpti_CallbackId id) {
  if (s != (CUpti_SubscriberHandle)&subscribed || !subscribed || d >= 8 || id >= 1024) return CUPTI_ERROR_INVALID_PARAMETER;
  *on = (uint32_t)cbs[d][id];
  return CUPTI_SUCCESS;
}
CUptiResult cuptiFinalize(void) {
  subscribed = 0, callback = NULL, requested = NULL, completed = NULL;
  memset(kinds, 0, sizeof kinds);
  memset(cbs, 0, sizeof cbs);
  return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext c, uint32_t s, size_t *n) {
  (void)c, (void)s;
  *n = dropped, dropped = 0;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **r) {
  uint8_t *next = *r ? (uint8_t *)*r + SLOT : buf;
  if (next + SLOT > buf + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *r = (CUpti_Activity *)next;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityFlushAll(uint32_t flag) {
  (void)flag;
  if (!nrec || !requested || !completed) return CUPTI_SUCCESS;
  uint8_t *buf;
  size_t size, max;
  requested(&buf, &size, &max);
  if (!buf || size < (size_t)nrec * SLOT) return CUPTI_ERROR_UNKNOWN;
  memcpy(buf, records, (size_t)nrec * SLOT);
  size_t valid = (size_t)nrec * SLOT;
  nrec = 0;
  completed(NULL, 0, buf, size, valid);
  return CUPTI_SUCCESS;
}

static void call(CUpti_CallbackDomain d, CUpti_CallbackId id, CUpti_ApiCallbackSite site, const char *fn,
                 const char *sym, uint32_t c) {
  if (!callback || !cbs[d][id]) return;
  CUpti_CallbackData cd = {0};
  cd.callbackSite = site, cd.functionName = fn, cd.symbolName = sym, cd.correlationId = c;
  callback(userdata, d, id, &cd);
}

static void kernel_record(const char *name, uint32_t c, uint32_t graph) {
  if (!kinds[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL] || nrec >= MAXREC) return;
  CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)records[nrec++];
  memset(k, 0, sizeof *k);
  k->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, k->name = strdup(name), k->correlationId = c, k->graphId = graph;
}

/* A kernel launched by cuLaunchKernel: the callback, then (activity permitting) the record. */
void fake_launch(const char *name) {
  uint32_t c = ++corr;
  call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_API_ENTER, "cuLaunchKernel", name, c);
  call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_API_EXIT, "cuLaunchKernel", name, c);
  kernel_record(name, c, 0);
}

/* cudaGraphLaunch of a graph running `name`: the runtime's callback, the driver's nested in it; the record
 * carries the runtime's correlation id (by_driver 0) or the driver's (1). */
void fake_graph(const char *name, int by_driver) {
  uint32_t rt = ++corr, dr = ++corr;
  call(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000, CUPTI_API_ENTER,
       "cudaGraphLaunch", NULL, rt);
  call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, CUPTI_API_ENTER, "cuGraphLaunch", NULL, dr);
  call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, CUPTI_API_EXIT, "cuGraphLaunch", NULL, dr);
  call(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000, CUPTI_API_EXIT,
       "cudaGraphLaunch", NULL, rt);
  kernel_record(name, by_driver ? dr : rt, 7);
}

void fake_memcpy(void) {
  if (!kinds[CUPTI_ACTIVITY_KIND_MEMCPY] || nrec >= MAXREC) return;
  CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)records[nrec++];
  memset(m, 0, sizeof *m);
  m->kind = CUPTI_ACTIVITY_KIND_MEMCPY, m->correlationId = ++corr;
}

void fake_drop(size_t n) { dropped += n; }
