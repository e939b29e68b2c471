/*
 * c_worker.c: a training process's worker loop in C, linked against libtaskd.so.
 *
 * One rank of a job: it starts taskd's worker with a switch function (here it stands in for
 * the framework's _comm_switch_nic and prints what it is asked), trains, and calls the step
 * gate after every step. It joins the node's proxy at $TASKD_PROXY (default 127.0.0.1:9602),
 * in the job $MINDX_TASK_ID, like a worker of the Python package; TSP comes from
 * $MS_ENABLE_TFT.
 *
 *   cargo build -p taskd-capi
 *   mkdir -p /tmp/taskd && ln -sf "$PWD/target/debug/libtaskd_capi.so" /tmp/taskd/libtaskd.so
 *   cc -std=c11 -Wall -Wextra -I capi/include examples/c_worker.c \
 *      -L /tmp/taskd -ltaskd -Wl,-rpath,/tmp/taskd -o /tmp/taskd/c_worker
 *   MINDX_TASK_ID=demo TASKD_PROXY=127.0.0.1:9602 MS_ENABLE_TFT='{TSP:1}' /tmp/taskd/c_worker 0 2
 *
 * Arguments: RANK [SWITCHES]. With SWITCHES, it trains until its switch function ran that
 * many times, then three more steps, and exits; without, it trains until killed. When the
 * manager stops training (taskd_worker_step_completed returns TASKD_STOP_TRAINING) it prints
 * the reason and exits 3, for its launcher to restart it.
 *
 * The switch function runs on the training thread, inside taskd_worker_step_completed: it
 * says so ("on the training thread") by comparing its thread with main's.
 * capi/tests/embedded.rs builds and runs it against a manager and a proxy.
 */
#define _POSIX_C_SOURCE 200809L
#include "taskd.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What the "framework" knows: how many switches it made, and whether a step is running. */
struct framework {
    atomic_int switches;
    atomic_bool in_step;
    atomic_uint_fast64_t step;
    pthread_t trainer; /* the training thread: main's */
};

static bool switch_nic(const uint32_t *ranks, const bool *use_backup, size_t n,
                       uint64_t timeout_ms, void *user, char *err, size_t err_len)
{
    struct framework *fw = user;
    const char *where = atomic_load(&fw->in_step)                 ? "during a step"
                        : pthread_equal(pthread_self(), fw->trainer) ? "on the training thread"
                                                                     : "on another thread";
    printf("switch: after step %" PRIuFAST64 ", %s, within %" PRIu64 " ms, targets",
           atomic_load(&fw->step), where, timeout_ms);
    for (size_t i = 0; i < n; i++)
        printf(" %" PRIu32 ":%s", ranks[i], use_backup[i] ? "backup" : "primary");
    printf("\n");
    fflush(stdout);
    atomic_fetch_add(&fw->switches, 1);
    /* A framework that fails writes why (it becomes this rank's error in the operation's
     * report, and the operation rolls back) and returns false. */
    (void)err;
    (void)err_len;
    return true;
}

static int fail(const char *what)
{
    fprintf(stderr, "c_worker: %s: %s\n", what, taskd_last_error());
    return 1;
}

/* One step's compute: a millisecond. */
static void compute(void)
{
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: c_worker RANK [SWITCHES]\n");
        return 2;
    }
    unsigned long rank = strtoul(argv[1], NULL, 10);
    int switches = argc > 2 ? atoi(argv[2]) : -1;

    char config[128];
    snprintf(config, sizeof config, "{\"rank\": %lu}", rank);
    static struct framework fw;
    fw.trainer = pthread_self();
    taskd_worker *w = NULL;
    if (taskd_worker_start(config, switch_nic, &fw, &w) != TASKD_OK)
        return fail("taskd_worker_start");

    char node[256];
    if (taskd_worker_wait_registered(w, 30000, node, sizeof node) != TASKD_OK) {
        int rc = fail("taskd_worker_wait_registered");
        taskd_worker_free(w);
        return rc;
    }
    printf("rank %lu registered on %s (libtaskd %s)\n", rank, node, taskd_version());
    fflush(stdout);

    uint64_t last_switch_step = 0;
    int seen = 0;
    for (uint64_t step = 1;; step++) {
        atomic_store(&fw.in_step, true);
        compute();
        atomic_store(&fw.in_step, false);
        atomic_store(&fw.step, step);
        /* Held here while taskd switches; the switch function runs inside this call. */
        int32_t rc = taskd_worker_step_completed(w, step);
        if (rc == TASKD_STOP_TRAINING) {
            printf("rank %lu stopped after step %" PRIu64 ": %s\n", rank, step, taskd_last_error());
            fflush(stdout);
            taskd_worker_stop(w);
            taskd_worker_free(w);
            return 3;
        }
        if (rc != TASKD_OK)
            return fail("taskd_worker_step_completed");
        int now = atomic_load(&fw.switches);
        if (now != seen) {
            seen = now;
            last_switch_step = step;
        }
        if (switches >= 0 && seen >= switches && step >= last_switch_step + 3) {
            printf("rank %lu trained %" PRIu64 " steps, %d switches\n", rank, step, seen);
            break;
        }
    }
    taskd_worker_stop(w);
    taskd_worker_free(w);
    return 0;
}
