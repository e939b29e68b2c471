/*
 * Stub libascendcl.so: device, stream and memory calls, recording every call. "Device" memory
 * is host memory with a header naming it buf#<id>; streams are logged as stream#<id>. Safe to
 * call from several threads at once (ids are handed out under a lock).
 *
 * aclInit follows recent CANN by default: it is reference-counted. Each aclInit adds a
 * reference; aclFinalizeReference takes one away and reports how many are left (the runtime is
 * deinitialised when none is); aclFinalize deinitialises at once and clears the count. Built
 * with -DSTUB_ACL_LEGACY it is an older runtime instead: no aclFinalizeReference, and a second
 * aclInit without aclFinalize answers ACL_ERROR_REPEAT_INITIALIZE. stub_acl_refs() reads the
 * count (legacy: 1 while initialised, else 0).
 */
#include "stub_common.h"

typedef int aclError;
typedef void *aclrtStream;

#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002

static struct stub_rc g_rc[] = {
    {"aclrtSetDevice", 0}, {"aclrtCreateStream", 0}, {"aclrtDestroyStream", 0},
    {"aclrtSynchronizeStream", 0}, {"aclrtMalloc", 0}, {"aclrtFree", 0},
    {"aclrtMemcpy", 0}, {"aclInit", 0}, {"aclFinalize", 0}, {"aclFinalizeReference", 0}, {0, 0},
};
static struct stub_rc *stub_rc_table(void) { return g_rc; }


static int g_next_buf = 1;
static int g_next_stream = 1;
static pthread_mutex_t g_ids_mu = PTHREAD_MUTEX_INITIALIZER;

static int next_id(int *counter) {
    pthread_mutex_lock(&g_ids_mu);
    int id = (*counter)++;
    pthread_mutex_unlock(&g_ids_mu);
    return id;
}

static unsigned long long g_refs;

unsigned long long stub_acl_refs(void) {
    pthread_mutex_lock(&g_ids_mu);
    unsigned long long r = g_refs;
    pthread_mutex_unlock(&g_ids_mu);
    return r;
}

aclError aclInit(const char *configPath) {
    stub_record("aclInit configPath=%s", configPath ? configPath : "NULL");
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_ids_mu);
#ifdef STUB_ACL_LEGACY
    int again = g_refs > 0;
    g_refs = 1;
#else
    int again = 0;
    g_refs++;
#endif
    pthread_mutex_unlock(&g_ids_mu);
    return again ? ACL_ERROR_REPEAT_INITIALIZE : 0;
}

aclError aclFinalize(void) {
    stub_record("aclFinalize");
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_ids_mu);
    g_refs = 0;
    pthread_mutex_unlock(&g_ids_mu);
    return 0;
}

#ifndef STUB_ACL_LEGACY
aclError aclFinalizeReference(uint64_t *refCount) {
    stub_record("aclFinalizeReference");
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_ids_mu);
    if (g_refs == 0)
        rc = ACL_ERROR_UNINITIALIZE;
    else
        g_refs--;
    if (refCount)
        *refCount = g_refs;
    pthread_mutex_unlock(&g_ids_mu);
    return rc;
}
#endif

aclError aclrtSetDevice(int32_t deviceId) {
    stub_record("aclrtSetDevice deviceId=%d", deviceId);
    return stub_rc_of(__func__);
}

aclError aclrtCreateStream(aclrtStream *stream) {
    int rc = stub_rc_of(__func__);
    if (rc) {
        stub_record("aclrtCreateStream");
        return rc;
    }
    struct stub_stream *s = calloc(1, sizeof *s);
    s->magic = STUB_STREAM_MAGIC;
    s->id = next_id(&g_next_stream);
    *stream = s;
    stub_record("aclrtCreateStream -> stream#%d", s->id);
    return 0;
}

aclError aclrtDestroyStream(aclrtStream stream) {
    stub_record("aclrtDestroyStream stream#%d", stub_stream_id(stream));
    int rc = stub_rc_of(__func__);
    if (!rc && stream)
        ((struct stub_stream *)stream)->destroyed = 1;
    return rc;
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
    stub_record("aclrtSynchronizeStream stream#%d", stub_stream_id(stream));
    return stub_rc_of(__func__);
}

aclError aclrtMalloc(void **devPtr, size_t size, int policy) {
    int rc = stub_rc_of(__func__);
    if (rc) {
        stub_record("aclrtMalloc size=%zu policy=%d", size, policy);
        return rc;
    }
    char *base = calloc(1, STUB_BUF_HEADER + size);
    struct stub_buf_header *h = (void *)base;
    h->magic = STUB_BUF_MAGIC;
    h->id = next_id(&g_next_buf);
    h->size = size;
    *devPtr = base + STUB_BUF_HEADER;
    stub_record("aclrtMalloc size=%zu policy=%d -> buf#%d", size, policy, h->id);
    return 0;
}

aclError aclrtFree(void *devPtr) {
    stub_record("aclrtFree buf#%d", stub_buf_id(devPtr));
    int rc = stub_rc_of(__func__);
    if (!rc && devPtr) {
        struct stub_buf_header *h = (void *)((char *)devPtr - STUB_BUF_HEADER);
        h->magic = 0;
        free(h);
    }
    return rc;
}

aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind) {
    stub_record("aclrtMemcpy dst=buf#%d destMax=%zu src=buf#%d count=%zu kind=%d",
                kind == 1 ? stub_buf_id(dst) : 0, destMax, kind == 2 ? stub_buf_id(src) : 0, count, kind);
    int rc = stub_rc_of(__func__);
    if (rc)
        return rc;
    if (count > destMax)
        return ACL_ERROR_INVALID_PARAM;
    memcpy(dst, src, count);
    return 0;
}
