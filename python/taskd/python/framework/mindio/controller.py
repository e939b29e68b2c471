"""MindIO's controller in a process of its own: the child that :class:`.host.MindioHost` starts
(``python controller.py CONFIG_JSON``). Standard library and ``mindio_ttp`` only: it does not
import ``taskd``, so it runs under any Python that has ``mindio_ttp``.

Why a process of its own: ``tft_start_controller`` ends its caller with ``SystemExit(2)`` on a
failure; a second controller (or any second MindIO logger) in one process aborts it; destroying
the controller blocks for seconds; and the controller's callbacks run on MindIO's C++ thread,
holding the GIL. None of that may reach the manager.

**The channel.** Commands arrive on standard input and answers and events leave on the
original standard output, one JSON object a line. Standard output is then pointed at standard
error, so nothing else written there (MindIO prints its first log lines to standard output
before its log file is open) can break a line of the channel.

- ``{"op": "last_words", "id": N, "faults": {"RANK": TYPE, ...}, "timeout_s": T}`` ->
  ``{"ev": "reply", "id": N, "taken": ..., "detail": ..., "code": ..., "strategy": ...,
  "fault_ranks": {...}, "seconds": ...}``
- ``{"op": "close"}``, or the end of standard input: destroys the controller and exits 0.
- events: ``{"ev": "listening", "pid": P}`` or ``{"ev": "start_failed", "reason": ...}`` once;
  ``{"ev": "fault", "ranks": {"RANK": TYPE}, "codes": {"RANK": CODE}}`` for every
  ``report_fault_ranks`` that names a rank; ``{"ev": "log", "level": ..., "msg": ...}``.

**The controller.** The four callbacks are registered before ``tft_init_controller`` and
``tft_start_controller`` (MindIO checks them once, at start; without them it decides alone and
ends every rank after a fault). They never raise (an exception sends MindIO's state machine
to its end) and only record: each moves :class:`Mirror`, the host's copy of the state machine,
and the commands send MindIO only the call its current state waits for (a call it does not
wait for stays latched and spoils its next decision). taskd never asks MindIO to pause: its
own step gate does. MindIO's part is the last-words checkpoint (``dump``):

- with faults, MindIO unaware yet: ``tft_notify_controller_stop_train(faults, "stop")`` ->
  ``report_stop_complete(0, "stop ok", faults)`` -> ``tft_notify_controller_on_global_rank`` ->
  ``report_strategies(faults, [...])`` -> ``tft_notify_controller_change_strategy("dump")`` if
  offered -> ``report_result(0, "do dump success", faults, "dump")``;
- without faults, or after MindIO reported a fault itself: ``tft_notify_controller_dump()`` ->
  ``report_result(...)``;
- a rank MindIO does not know (its processor never registered) makes it refuse
  ``stop_train``: then ``tft_notify_controller_dump()`` for the others;
- then ``tft_notify_controller_change_strategy("exit")``: the state machine ends quietly (EXIT,
  then FINAL), where left alone it would have every rank's exit handler end its process
  ``MINDIO_WAIT_MINDX_TIME`` (30 s) later. The held ranks stay held: the host kills them.
  Where that call itself only takes MindIO to EXIT (from ABNORMAL, after ``stop ok``, after
  ``report_strategies``: no callback says so), the same call follows 0.2 s and 1 s later: two
  calls MindIO receives before it wakes count as one. Once a last words has called MindIO,
  whatever MindIO waits for afterwards (the late answers to a call that ran out of time) is
  answered the same way.
"""

import errno
import json
import os
import queue
import socket
import sys
import threading
import time

CALLBACKS = ("report_fault_ranks", "report_stop_complete", "report_strategies", "report_result")

# The states of MindIO's controller as the host follows them (``Mirror.state``).
NORMAL = "normal"  # training; MindIO watches the heartbeats
ABNORMAL = "abnormal"  # a fault: the healthy ranks held, MindIO waits for stop_train or dump
STOPPED = "stopped"  # report_stop_complete(0): MindIO waits for on_global_rank
STRATEGIES = "strategies"  # report_strategies: MindIO waits for change_strategy
DUMPING = "dumping"  # dump asked for: the savers run, report_result follows
EXIT = "exit"  # MindIO's state machine ended its work; it waits for any call, else ends the ranks
FINAL = "final"  # nothing more: only a new controller (a new process) serves again

#: after change_strategy("exit") in a state that goes to EXIT without a callback, the later
#: calls that move EXIT on to FINAL (two calls MindIO receives before it wakes count as one;
#: a call in FINAL does nothing)
EXIT_FOLLOW_UPS_S = (0.2, 1.0)


class Channel:
    """The answers and events to the host, written by a thread of their own: a callback on
    MindIO's thread only queues (it must not wait for a pipe)."""

    def __init__(self, out):
        self.out = out
        self.q = queue.Queue()
        threading.Thread(target=self._write, name="mindio-channel", daemon=True).start()

    def send(self, **msg):
        self.q.put(msg)

    def log(self, level, msg):
        self.send(ev="log", level=level, msg=msg)

    def _write(self):
        while True:
            msg = self.q.get()
            try:
                self.out.write(json.dumps(msg, default=repr) + "\n")
                self.out.flush()
            except (OSError, ValueError):
                return  # the host is gone: the end of standard input ends this process

    def drain(self, timeout_s):
        end = time.monotonic() + timeout_s
        while not self.q.empty() and time.monotonic() < end:
            time.sleep(0.01)


class Event:
    __slots__ = ("seq", "name", "args")

    def __init__(self, seq, name, args):
        self.seq, self.name, self.args = seq, name, args


class Mirror:
    """The host's copy of MindIO's state machine, moved by the callbacks and by the calls the
    host sends; every callback is kept, numbered, for the waiters."""

    def __init__(self):
        self.cond = threading.Condition()
        self.state = NORMAL
        self.ended = ""  # why the state machine went to EXIT
        self.events = []

    def record(self, name, args):
        with self.cond:
            self.events.append(Event(len(self.events) + 1, name, args))
            if self.state == FINAL:
                pass  # a late report of a call made before the host ended the state machine
            elif name == "report_fault_ranks":
                if self.state == NORMAL:
                    self.state = ABNORMAL
            elif name == "report_stop_complete":
                code, msg = args[0], args[1]
                if code == 0 and msg == "stop ok":
                    self.state = STOPPED
                elif code != 0:
                    self._end("report_stop_complete(%s, %r)" % (code, msg))
            elif name == "report_strategies":
                self.state = STRATEGIES
            elif name == "report_result":
                code, msg, strategy = args[0], args[1], args[3]
                if code == 406:  # a pause that was not continued: MindIO holds and reports
                    self.state = ABNORMAL
                elif code == 0 and strategy not in ("dump", "exit"):
                    self.state = NORMAL  # continue, or a repair that succeeded
                else:
                    self._end("report_result(%s, %r, strategy %r)" % (code, msg, strategy))
            self.cond.notify_all()

    def _end(self, why):
        if self.state != FINAL:
            self.state = EXIT
            self.ended = why

    def move(self, state, why=""):
        with self.cond:
            if state == EXIT:
                self._end(why)
            else:
                self.state = state
            self.cond.notify_all()

    def wait(self, names, after, deadline):
        """The first callback named in ``names`` after event number ``after``, or ``None`` at
        the deadline (``time.monotonic()``)."""
        with self.cond:
            while True:
                for e in self.events[after:]:
                    if e.name in names:
                        return e
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)


def bind_problem(ip, port):
    """Why ``ip:port`` cannot be listened on, or ``None`` (the same socket option as MindIO's
    listener: SO_REUSEADDR, so a port held only by closed connections counts as free)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ip, port))
        return None
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return "port %d is in use on %s" % (port, ip)
        if e.errno == errno.EADDRNOTAVAIL:
            return "%s is not an address of this host" % ip
        return "%s:%d cannot be bound: %s" % (ip, port, e.strerror or e)
    finally:
        s.close()


class Controller:
    def __init__(self, config, channel):
        self.cfg = config
        self.ch = channel
        self.mirror = Mirror()
        self.api = None
        self.busy = threading.Lock()  # one last words at a time
        # once a last words has called MindIO, whatever MindIO waits for afterwards is answered
        # "exit" (a call that timed out may still be answered late)
        self.spent = False
        self.touched = False
        self.exiting = threading.Lock()

    # ---- the callbacks (MindIO's thread, holding the GIL): record, queue, return
    def _callback(self, name):
        def callback(*args):
            try:
                self.ch.log("info", "MindIO: %s%r" % (name, tuple(args)))
                self.mirror.record(name, args)
                if self.spent:
                    threading.Thread(target=self._exit, name="mindio-exit", daemon=True).start()
                if name == "report_fault_ranks" and args and args[0]:
                    codes = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
                    self.ch.send(ev="fault", ranks={str(r): t for r, t in dict(args[0]).items()},
                                 codes={str(r): str(c) for r, c in codes.items()})
            except BaseException as e:  # never into MindIO: it would end its state machine
                try:
                    self.ch.log("error", "MindIO callback %s failed: %r" % (name, e))
                except BaseException:
                    pass
            return 0

        return callback

    def start(self):
        """Registers the callbacks, initialises and starts the controller. Returns ``None`` once
        it listens, else the reason."""
        ip, port = self.cfg["ip"], self.cfg["port"]
        try:
            from mindio_ttp import controller_ttp as api
        except BaseException as e:
            return "mindio_ttp cannot be imported by %s: %r" % (sys.executable, e)
        self.api = api
        for name in CALLBACKS:
            rc = api.tft_register_mindx_callback(name, self._callback(name))
            if rc != 0:
                return "tft_register_mindx_callback(%r) returned %s" % (name, rc)
        problem = bind_problem(ip, port)
        if problem:
            return problem
        try:
            api.tft_init_controller(-1, self.cfg["world"], False, self.cfg["arf"],
                                    self.cfg["elastic"])
        except BaseException as e:
            return "tft_init_controller(-1, %s, False, %s, %s) failed: %r" % (
                self.cfg["world"], self.cfg["arf"], self.cfg["elastic"], e)
        try:
            api.tft_start_controller(ip, port, False, "")
        except BaseException as e:  # SystemExit(2) on any failure
            problem = bind_problem(ip, port)
            return "tft_start_controller(%r, %d) failed (%r)%s; MindIO's log is under %s" % (
                ip, port, e, ": " + problem if problem else "",
                os.environ.get("TTP_LOG_PATH", "logs"))
        return None

    # ---- the host's calls: only the one the current state waits for
    def _notify(self, fn, *args):
        self.touched = True
        rc = getattr(self.api, fn)(*args)
        self.ch.log("info", "%s%r -> %s" % (fn, args, rc))
        return rc

    def _exit(self):
        """Ends MindIO's state machine without its exit handler ending the ranks. In NORMAL
        there is nothing to end; in DUMPING the savers still run, and the ``report_result``
        that ends it calls this again."""
        with self.exiting:
            with self.mirror.cond:
                state = self.mirror.state
            if state in (FINAL, NORMAL, DUMPING):
                return
            self._notify("tft_notify_controller_change_strategy", "exit")
            if state != EXIT:
                # ABNORMAL, STOPPED, STRATEGIES: this call takes it to EXIT, without a callback;
                # the follow-ups take EXIT to FINAL.
                threading.Thread(target=self._exit_follow_ups, name="mindio-exit",
                                 daemon=True).start()
            self.mirror.move(FINAL)

    def _exit_follow_ups(self):
        start = time.monotonic()
        for at in EXIT_FOLLOW_UPS_S:
            time.sleep(max(0.0, start + at - time.monotonic()))
            self._notify("tft_notify_controller_change_strategy", "exit")

    def last_words(self, faults, timeout_s):
        t0 = time.monotonic()
        deadline = t0 + max(0.0, timeout_s)
        out = {"taken": False, "detail": "", "code": None, "strategy": None, "fault_ranks": {}}

        def done(detail, event=None):
            out["detail"] = detail
            if event is not None and event.name == "report_result":
                out["code"], out["strategy"] = event.args[0], event.args[3]
                out["fault_ranks"] = {str(r): t for r, t in dict(event.args[2]).items()}
            elif event is not None:
                out["code"] = event.args[0]
            out["seconds"] = round(time.monotonic() - t0, 4)
            return out

        if not self.busy.acquire(timeout=max(0.0, timeout_s)):
            return done("another last words is still in progress")
        try:
            self.touched = False
            return self._last_words(faults, deadline, done)
        except BaseException as e:
            return done("the controller process failed: %r" % (e,))
        finally:
            self.busy.release()
            if self.touched:
                self.spent = True
                self._exit()

    def _last_words(self, faults, deadline, done):
        m = self.mirror
        with m.cond:
            state, seq, ended = m.state, len(m.events), m.ended
        if state in (EXIT, FINAL):
            return done("MindIO's controller has already ended its state machine (%s): a new "
                        "controller serves the next generation of workers" % (ended or state))
        if state not in (NORMAL, ABNORMAL):
            return done("MindIO's controller is in the middle of a recovery (%s)" % state)

        def wait(names, what):
            e = m.wait(names, seq, deadline)
            if e is None:
                raise _Timeout(what)
            return e

        try:
            if faults and state == NORMAL:
                rc = self._notify("tft_notify_controller_stop_train", faults, "stop")
                if rc != 0:  # a rank MindIO does not know (never registered): dump the others
                    self.ch.log("warning", "stop_train(%r) refused (rc %s): asking for a dump "
                                "instead" % (faults, rc))
                    return self._dump(done, wait)
                e = wait(("report_stop_complete", "report_result"), "report_stop_complete")
                seq = e.seq
                if e.name == "report_result" or e.args[0] != 0:
                    return done(_why_not(e), e)
                rc = self._notify("tft_notify_controller_on_global_rank", faults)
                if rc != 0:
                    return done("MindIO refused on_global_rank: rc %s" % rc)
                e = wait(("report_strategies", "report_result"), "report_strategies")
                seq = e.seq
                if e.name == "report_result":
                    return done(_why_not(e), e)
                offered = list(e.args[1])
                if "dump" not in offered:
                    return done("MindIO offers no dump, only %s: a surviving rank could not be "
                                "held at a finished step" % offered)
                m.move(DUMPING)
                rc = self._notify("tft_notify_controller_change_strategy", "dump")
                if rc != 0:
                    m.move(EXIT, "change_strategy('dump') was refused")
                    return done("MindIO refused change_strategy('dump'): rc %s" % rc)
                return self._result(wait(("report_result",), "report_result"), done)
            return self._dump(done, wait)
        except _Timeout as t:
            return done("no %s from MindIO's controller in time (state %s)" % (t, m.state))

    def _dump(self, done, wait):
        with self.mirror.cond:
            before = self.mirror.state
        self.mirror.move(DUMPING)
        rc = self._notify("tft_notify_controller_dump")
        if rc != 0:
            self.mirror.move(before)
            return done("MindIO refused the dump: rc %s" % rc)
        return self._result(wait(("report_result",), "report_result"), done)

    @staticmethod
    def _result(e, done):
        code, msg, strategy = e.args[0], e.args[1], e.args[3]
        if code == 0 and strategy == "dump":
            out = done("MindIO's last-words checkpoint is written (%s)" % msg, e)
            out["taken"] = True
            return out
        return done(_why_not(e), e)

    def close(self):
        try:
            if self.api is not None:
                self.api.tft_destroy_controller()
        except BaseException as e:
            self.ch.log("warning", "tft_destroy_controller failed: %r" % (e,))


class _Timeout(Exception):
    pass


def _why_not(e):
    """One line for a report that ends the last words without a checkpoint."""
    if e.name == "report_stop_complete":
        code, msg = e.args[0], e.args[1]
        if code == 404:
            return ("MindIO cannot dump: no rank ever reported its replica info "
                    "(report_stop_complete(404, %r): MS_ENABLE_TFT without TTP:1, as {TSP:1} "
                    "alone)" % msg)
        return "MindIO stopped without a dump: report_stop_complete(%s, %r)" % (code, msg)
    code, msg, strategy = e.args[0], e.args[1], e.args[3]
    if msg == "do not support dump!":
        return ("MindIO cannot dump: no rank has reported a finished optimizer step "
                "(report_result(%s, %r): a job of one rank, or MS_ENABLE_TFT without TTP:1, never "
                "reports one)" % (code, msg))
    return "MindIO's dump failed: report_result(%s, %r, strategy %r)" % (code, msg, strategy)


def main():
    config = json.loads(sys.argv[1])
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    ch = Channel(out)
    ctl = Controller(config, ch)
    why = ctl.start()
    if why:
        ch.send(ev="start_failed", reason=why)
        ch.drain(2.0)
        os._exit(1)
    ch.send(ev="listening", pid=os.getpid())
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
        except ValueError:
            ch.log("error", "not a command: %r" % line[:200])
            continue
        if cmd.get("op") == "close":
            break
        if cmd.get("op") == "last_words":
            faults = {int(r): int(t) for r, t in cmd.get("faults", {}).items()}

            def run(cmd=cmd, faults=faults):
                reply = ctl.last_words(faults, float(cmd.get("timeout_s", 30.0)))
                ch.send(ev="reply", id=cmd.get("id"), **reply)

            threading.Thread(target=run, name="mindio-last-words", daemon=True).start()
        else:
            ch.log("error", "unknown command %r" % cmd.get("op"))
    ctl.close()
    ch.drain(1.0)
    os._exit(0)  # not MindIO's atexit hook: it would destroy the controller a second time


if __name__ == "__main__":
    main()
