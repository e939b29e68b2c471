#!/usr/bin/env bash
# taskd's launcher for a MindFormers job under MindCluster: mindformers-job.yaml (beside this
# file) runs it in every pod. It starts taskd's manager and MindIO's controller where
# MS_SCHED_HOST == POD_IP (the Scheduler pod), a taskd proxy in every pod, then msrun with the
# arguments it was given.
# Ascend Operator sets every variable read here but POD_IP, which the job YAML takes from the
# downward API. docs/clusterd.md says what runs where and what to expect.
set -uo pipefail

TASKD="${TASKD_BIN:-taskd}"
ENTRY="${MINDFORMERS_ENTRY:-/job/code/run_mindformer.py}"
LOG_DIR="${TASKD_LOG_DIR:-/job/code/alllogs/${MINDX_TASK_ID:-job}}"

for v in MINDX_TASK_ID MS_SCHED_HOST MS_SCHED_PORT POD_IP MS_NODE_RANK MS_WORKER_NUM MS_LOCAL_WORKER; do
    if [[ -z "${!v:-}" ]]; then
        echo "taskd-launcher: $v is not set (MindCluster sets it; see mindformers-job.yaml)" >&2
        exit 2
    fi
done

# An address as MindCluster writes it: an IPv6 address may come in brackets.
host() {
    local h="${1#\[}"
    h="${h%\]}"
    printf '%s' "${h,,}"
}

# MindIO TTP: with MS_ENABLE_TFT holding TTP:1, UCE:1, ARF:1, TSP:1 or HCCE:1, MindSpore on an
# Ascend device makes every training process a MindIO processor that connects to MindIO's
# controller at MS_TFT_IP:MS_TFT_PORT and ends itself about 85 s after start without one. The
# controller runs on the Scheduler pod (below), on POD_IP:TTP_PORT; Ascend Operator's
# MINDX_TASK_ID keeps rank 0 from starting one of its own.
export TTP_PORT="${TTP_PORT:-8000}"
export MS_TFT_IP="${MS_TFT_IP:-$(host "$MS_SCHED_HOST")}"
export MS_TFT_PORT="${MS_TFT_PORT:-$TTP_PORT}"
export MINDIO_FOR_MINDSPORE="${MINDIO_FOR_MINDSPORE:-1}"

mkdir -p "$LOG_DIR/taskd"
pids=()
# Starts a taskd role in the background, its output in $LOG_DIR/taskd/LOG, and says so.
start() {
    local log="$1"
    shift
    echo "taskd-launcher: starting $* (log: $LOG_DIR/taskd/$log)" >&2
    "$@" >>"$LOG_DIR/taskd/$log" 2>&1 &
    pids+=("$!")
}
if [[ "$(host "$MS_SCHED_HOST")" == "$(host "$POD_IP")" ]]; then
    # The job's manager: its id from MINDX_TASK_ID, ClusterD from MINDX_SERVER_IP (port 8899),
    # its proxies on port 9601 (the container port taskd-port).
    start manager.log "$TASKD" manager --nodes "$((MS_WORKER_NUM / MS_LOCAL_WORKER))" \
        --procs-per-node "$MS_LOCAL_WORKER"
    # MindIO's controller, from POD_IP, TTP_PORT and MS_WORKER_NUM, its log under
    # $LOG_DIR/taskd/mindio (where mindio_ttp is missing it says so once and ends).
    start mindio.log env TASKD_LOG_PATH="$LOG_DIR/taskd" "${TASKD_PYTHON:-python3}" \
        -m taskd.python.framework.mindio
fi
# This pod's proxy: its node rank from MS_NODE_RANK, the manager at $MS_SCHED_HOST:9601; the
# training processes' workers reach it at 127.0.0.1:9602.
start "proxy-$MS_NODE_RANK.log" "$TASKD" proxy

# taskd ends what it runs safely on SIGTERM (an operation in flight rolls back and resumes).
stop_taskd() {
    kill -TERM "${pids[@]}" 2>/dev/null
    wait "${pids[@]}" 2>/dev/null
}

msrun --worker_num="$MS_WORKER_NUM" --local_worker_num="$MS_LOCAL_WORKER" \
    --master_addr="$MS_SCHED_HOST" --master_port="$MS_SCHED_PORT" \
    --node_rank="$MS_NODE_RANK" --log_dir="$LOG_DIR/msrun" --join=True \
    "$ENTRY" "$@" &
train=$!
trap 'kill -TERM "$train" 2>/dev/null; wait "$train"; stop_taskd; exit 143' TERM INT
wait "$train"
status=$?
stop_taskd
exit "$status"
