/*
 * Shared by the stub libraries the hal-ascend tests compile at test time (and that
 * `taskd_hal_ascend::testing` compiles for other crates' tests and the hardware-in-the-loop
 * rig). Each stub keeps, per loaded instance (the tests load a fresh copy per test, so instances
 * never share state):
 *   - a call log, one line per C call with its arguments, read with stub_log();
 *   - a table of return codes per function, set with stub_set_result().
 * Both are guarded by one mutex, so threads (one per rank, as in the rig) may call the stub at
 * once; lines of concurrent calls appear in the order their calls took the lock.
 * Nothing here touches the environment or the file system. Build with -pthread.
 */
#ifndef TASKD_STUB_COMMON_H
#define TASKD_STUB_COMMON_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime, strdup */
#endif
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STUB_LOG_CAP (1 << 22)

static char g_log[STUB_LOG_CAP];
static size_t g_log_len;
static int g_log_overflow;
/* Guards the log and the return-code table. Never held while waiting for anything. */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

static void stub_record(const char *fmt, ...) {
    pthread_mutex_lock(&g_log_mu);
    size_t room = STUB_LOG_CAP - g_log_len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g_log + g_log_len, room, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n + 1 >= room) {
        g_log_overflow = 1;
        g_log[g_log_len] = '\0';
        pthread_mutex_unlock(&g_log_mu);
        return;
    }
    g_log_len += (size_t)n;
    g_log[g_log_len++] = '\n';
    g_log[g_log_len] = '\0';
    pthread_mutex_unlock(&g_log_mu);
}

struct stub_rc {
    const char *fn;
    int code;
};

/* Each stub defines its table of functions, terminated by {0, 0}, and returns it here. */
static struct stub_rc *stub_rc_table(void);

static int stub_rc_of(const char *fn) {
    int code = 0;
    pthread_mutex_lock(&g_log_mu);
    for (struct stub_rc *r = stub_rc_table(); r->fn; r++)
        if (strcmp(r->fn, fn) == 0) {
            code = r->code;
            break;
        }
    pthread_mutex_unlock(&g_log_mu);
    return code;
}

/* The CLOCK_REALTIME instant `ms` milliseconds from now, for pthread_cond_timedwait. */
static inline struct timespec stub_deadline_after_ms(long ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    return until;
}

/* Copies the log (NUL-terminated, truncated to cap) and returns its full length. */
size_t stub_log(char *out, size_t cap) {
    pthread_mutex_lock(&g_log_mu);
    size_t len = g_log_len;
    if (cap > 0) {
        size_t n = len < cap - 1 ? len : cap - 1;
        memcpy(out, g_log, n);
        out[n] = '\0';
    }
    pthread_mutex_unlock(&g_log_mu);
    return len;
}

int stub_log_overflowed(void) {
    pthread_mutex_lock(&g_log_mu);
    int o = g_log_overflow;
    pthread_mutex_unlock(&g_log_mu);
    return o;
}

void stub_clear_log(void) {
    pthread_mutex_lock(&g_log_mu);
    g_log_len = 0;
    g_log[0] = '\0';
    pthread_mutex_unlock(&g_log_mu);
}

/* Makes `fn` return `code` from now on (0 restores success). -1 if `fn` is not stubbed here. */
int stub_set_result(const char *fn, int code) {
    int found = -1;
    pthread_mutex_lock(&g_log_mu);
    for (struct stub_rc *r = stub_rc_table(); r->fn; r++)
        if (strcmp(r->fn, fn) == 0) {
            r->code = code;
            found = 0;
            break;
        }
    pthread_mutex_unlock(&g_log_mu);
    return found;
}

/* Shared by the ACL and HCCL stubs so HCCL's log can name ACL's buffers and streams. */
#define STUB_BUF_MAGIC 0x42554631u
#define STUB_STREAM_MAGIC 0x5354524du
#define STUB_BUF_HEADER 32
struct stub_buf_header {
    uint32_t magic;
    int id;
    size_t size;
};
struct stub_stream {
    uint32_t magic;
    int id;
    int destroyed;
};

static inline int stub_buf_id(const void *p) {
    if (!p)
        return 0;
    const struct stub_buf_header *h = (const void *)((const char *)p - STUB_BUF_HEADER);
    return h->magic == STUB_BUF_MAGIC ? h->id : -1;
}

static inline int stub_stream_id(const void *s) {
    if (!s)
        return 0;
    const struct stub_stream *st = s;
    return st->magic == STUB_STREAM_MAGIC ? st->id : -1;
}

#endif
