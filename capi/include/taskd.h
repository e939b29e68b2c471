/*
 * taskd.h: the C API of libtaskd.so (crate taskd-capi, capi/src/ffi.rs).
 *
 * Starts taskd's roles inside a host process: a job's manager, a node's proxy, a training
 * process's worker. Each is configured by a JSON object whose keys are the long flags of the
 * matching `taskd` subcommand with dashes as underscores ("switch_timeout_ms": 5000 is
 * --switch-timeout-ms 5000), with the same defaults, environment variables and limits; a
 * proxy also takes the reference TaskD's keys (UpstreamAddr, UpstreamPort, ListenAddr,
 * ListenPort, ServerRank) and a manager its node_nums and proc_per_node. A worker's keys are
 * job_id, rank, proxy, node_rank, rank_table, tsp and the transport's (tls_*, heartbeat_ms, ...).
 *
 * Errors: every function returning int32_t returns TASKD_OK or a TASKD_ERR_* code; the
 * message, naming the bad value, is then taskd_last_error() on the same thread.
 * No panic or exception ever unwinds out of the library.
 *
 * Threads: the roles run on threads of their own. Every function taking a handle may be
 * called from any thread, concurrently, except taskd_*_free, which must be a handle's last
 * call. taskd_worker_step_completed is the training thread's (one thread per worker); it is a
 * load and a compare-and-swap unless an operation holds the rank at that step. The
 * framework's switch function runs on that thread, inside taskd_worker_step_completed.
 *
 * Link: cc prog.c -I capi/include -L <dir of libtaskd.so> -ltaskd. `cargo build -p
 * taskd-capi` writes target/<profile>/libtaskd_capi.so, whose SONAME is libtaskd.so: copy or
 * link it under that name. The Python package ships it as
 * <site-packages>/taskd/python/cython_api/libs/libtaskd.so.
 */
#ifndef TASKD_H
#define TASKD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
#define TASKD_OK 0
#define TASKD_ERR_ARGUMENT 1 /* null pointer, text not UTF-8, configuration not a JSON object, buffer too small */
#define TASKD_ERR_CONFIG 2   /* the configuration is refused (unknown key, bad value, missing job id) */
#define TASKD_ERR_START 3    /* the role could not start (port taken, TLS files, threads) */
#define TASKD_ERR_REFUSED 4  /* the manager or the proxy refused the registration for good */
#define TASKD_ERR_TIMEOUT 5  /* a wait ran out of time */
#define TASKD_ERR_STOPPED 6  /* the role stopped before what was waited for happened */
#define TASKD_ERR_PANIC 7    /* a bug in taskd, caught at the boundary */
#define TASKD_STOP_TRAINING 8 /* taskd_worker_step_completed: the manager stopped training */

/* taskd_manager_start flags. */
#define TASKD_MANAGER_SIGNALS 1 /* SIGINT, SIGTERM and SIGHUP stop the manager, not the process */

/* taskd_manager_addr: which address. */
#define TASKD_ADDR_LISTEN 0  /* the port proxies connect to */
#define TASKD_ADDR_CONTROL 1 /* the operators' control API ("" when not served) */

/* Timeouts are in milliseconds; this one waits for ever. */
#define TASKD_FOREVER UINT64_MAX

typedef struct TaskdManager taskd_manager;
typedef struct TaskdProxy taskd_proxy;
typedef struct TaskdWorker taskd_worker;

/*
 * The training framework's switch function (MindSpore's or torch_npu's _comm_switch_nic):
 * ranks[i] (global ranks) use their backup NIC when use_backup[i], for n targets: the WHOLE
 * target list of the operation, the same on every rank. Return true when every communicator
 * of the process switched; on false, a NUL-terminated reason of at most err_len bytes may be
 * written into err (it becomes this rank's error in the operation's report, and the operation
 * rolls back, calling the function again with the previous state).
 *
 * timeout_ms is the time this call has: shorter than the manager's switch phase, so that a
 * rollback still has time. A function that cannot finish in time (a collective rebuild whose
 * peer gave up) returns false with a reason; one that overstays it by a quarter is reported
 * as timed out while it goes on running.
 *
 * Called ON THE TRAINING THREAD, inside its taskd_worker_step_completed, while that thread is
 * held at the step gate (never two calls at once, never while the thread trains); after the
 * call the thread goes on waiting there for the resume, the stop, or the next call (a
 * rollback). user is the pointer given to taskd_worker_start.
 */
typedef bool (*taskd_switch_fn)(const uint32_t *ranks, const bool *use_backup, size_t n,
                                uint64_t timeout_ms, void *user, char *err, size_t err_len);

/* The library's version ("0.1.0"), a static string. */
const char *taskd_version(void);

/* The calling thread's last error message ("" if none), valid until its next failing call. */
const char *taskd_last_error(void);

/* Checks a configuration of role "manager", "proxy" or "worker" without starting anything. */
int32_t taskd_check_config(const char *role, const char *config_json);

/* Starts a job's manager; returns once it listens. flags: 0 or TASKD_MANAGER_SIGNALS. */
int32_t taskd_manager_start(const char *config_json, uint32_t flags, taskd_manager **out);

/* Writes the address `which` (TASKD_ADDR_*) as text; TASKD_ERR_ARGUMENT if buf is too small. */
int32_t taskd_manager_addr(const taskd_manager *m, int32_t which, char *buf, size_t len);

/* Waits until every expected worker registered and the job is verified (switches are
 * accepted from then on): TASKD_OK, TASKD_ERR_TIMEOUT or TASKD_ERR_STOPPED. */
int32_t taskd_manager_wait_ready(const taskd_manager *m, uint64_t timeout_ms);

/* Waits until the manager stopped (a signal, taskd_manager_stop); writes why into `why`
 * (may be NULL). */
int32_t taskd_manager_wait(const taskd_manager *m, uint64_t timeout_ms, char *why, size_t why_len);

/*
 * A host of the last-words checkpoint (MindIO's dump): asked before every stop of training to
 * take a checkpoint of the last step the ranks finished from the ranks still alive (dead[0..n]
 * are the ranks whose process died; n is 0 for a stop without a fault), within timeout_ms.
 * Returns whether a checkpoint was taken; a NUL-terminated line for people (what was saved,
 * or why not) of at most detail_len bytes may be written into detail. Called on a thread of
 * the library's own; it may block.
 */
typedef bool (*taskd_last_words_fn)(const uint32_t *dead, size_t n, uint64_t timeout_ms,
                                    void *user, char *detail, size_t detail_len);

/* Asks last_words (with user) for a last-words checkpoint before every stop of training from
 * now on, each within timeout_ms: the stop's directive goes out once it answered. last_words
 * may be called until taskd_manager_free returned. */
int32_t taskd_manager_set_last_words(const taskd_manager *m, taskd_last_words_fn last_words,
                                     void *user, uint64_t timeout_ms);

/* The process of `rank` died, as something outside taskd's transport saw it (MindIO's own
 * fault detection): handled as a lost worker. */
int32_t taskd_manager_report_fault(const taskd_manager *m, uint32_t rank, const char *why);

/* Asks the manager to stop (it ends an operation in flight safely first); returns at once. */
int32_t taskd_manager_stop(const taskd_manager *m);

/* Stops the manager if it runs, waits for it and frees the handle (NULL: nothing). */
void taskd_manager_free(taskd_manager *m);

/* Starts a node's proxy; returns once it listens for the node's workers. It joins the
 * manager in the background, retrying until the manager is there. */
int32_t taskd_proxy_start(const char *config_json, taskd_proxy **out);

/* Writes the address the node's workers connect to. */
int32_t taskd_proxy_addr(const taskd_proxy *p, char *buf, size_t len);

/* Waits until the manager admitted the proxy; writes the node's name into `node` (may be
 * NULL). TASKD_ERR_REFUSED when refused for good. */
int32_t taskd_proxy_wait_registered(const taskd_proxy *p, uint64_t timeout_ms, char *node,
                                    size_t node_len);

/* Waits at most timeout_ms for the manager's next order for the node's launcher and writes it
 * as JSON into buf: {"order": "restart", "number": N, "reason": ...} (stop every worker of the
 * node and start them all again, as restart N of the job) or {"order": "end", "reason": ...}
 * (end the job on this node). TASKD_ERR_TIMEOUT when none came. */
int32_t taskd_proxy_next_order(const taskd_proxy *p, uint64_t timeout_ms, char *buf, size_t len);

/* The launcher saw the process of `rank` end: `status` says how, for people; `clean` when it
 * exited with status 0; `generation` is the job restart it was started for (0: the first
 * start). The manager learns it even of a worker that never registered. */
int32_t taskd_proxy_worker_exited(const taskd_proxy *p, uint32_t rank, const char *status,
                                  bool clean, uint32_t generation);

/* Stops the proxy (its workers and the manager are told) and waits until it has. */
int32_t taskd_proxy_stop(const taskd_proxy *p);

/* Stops the proxy if it runs and frees the handle (NULL: nothing). */
void taskd_proxy_free(taskd_proxy *p);

/* Starts the worker of a training process, switching through switch_fn (called with user
 * until taskd_worker_stop or taskd_worker_free returned). Returns at once; the worker
 * connects to its proxy in the background. */
int32_t taskd_worker_start(const char *config_json, taskd_switch_fn switch_fn, void *user,
                           taskd_worker **out);

/*
 * A training process's in-flight side: how it aborts its collectives in flight and finishes
 * the step on rebuilt groups when the manager moves the job inside a step (taskd's Gloo
 * switch has one). request is a NUL-terminated JSON object:
 *   {"op": "abort", "ranks": [..], "use_backup": [..]}
 *       -> {"collectives": [{"group": "0", "size": 4, "completed": 41, "issued": 42}, ...]}
 *   {"op": "switch", "ranks": [..], "use_backup": [..], "timeout_ms": N,
 *    "redo": [{"group": "0", "from": 41}, ...]}  -> {}
 *   {"op": "give_up", "reason": "..."}  -> {}
 * Returns true with the answer, or false with the reason, NUL-terminated in reply (at most
 * reply_len bytes). Called from a thread of taskd's, NOT the training thread (which waits
 * mid-step), one call at a time, with the user given to taskd_worker_set_in_flight.
 */
typedef bool (*taskd_in_flight_fn)(const char *request, char *reply, size_t reply_len,
                                   void *user);

/* Registers the in-flight side of the worker's process (once; until taskd_worker_free).
 * TASKD_ERR_ARGUMENT for a null handle or function, or a second registration. */
int32_t taskd_worker_set_in_flight(const taskd_worker *w, taskd_in_flight_fn f, void *user);

/* The step gate: call after every training step (step 1 is the first). Returns TASKD_OK at
 * once unless an operation holds the rank at this step (the switch function then runs on
 * this thread, inside this call); a stopped worker passes. TASKD_STOP_TRAINING once the
 * manager stopped training: end the training loop and exit non-zero (the launcher restarts
 * the process); taskd_last_error() has the reason, one line. TASKD_ERR_ARGUMENT for NULL. */
int32_t taskd_worker_step_completed(const taskd_worker *w, uint64_t step);

/* Waits until the proxy admitted the worker; writes the node's name into `node` (may be
 * NULL). TASKD_ERR_REFUSED when refused for good. */
int32_t taskd_worker_wait_registered(const taskd_worker *w, uint64_t timeout_ms, char *node,
                                     size_t node_len);

/* Waits until the job is whole: every rank of the job registered with the manager, which then
 * asked this one in a verification round. For a training loop before its first step, so that
 * a restarted rank's first collective does not run ahead of peers still starting.
 * TASKD_ERR_TIMEOUT when `timeout_ms` passed first, TASKD_ERR_STOPPED for a stopped worker. */
int32_t taskd_worker_wait_job_whole(const taskd_worker *w, uint64_t timeout_ms);

/* Stops the worker (the gate opens for good, the proxy is told) and waits until it has. The
 * handle stays valid: later steps pass at once. */
int32_t taskd_worker_stop(const taskd_worker *w);

/* Stops the worker if it runs and frees the handle (NULL: nothing). */
void taskd_worker_free(taskd_worker *w);

#ifdef __cplusplus
}
#endif

#endif /* TASKD_H */
