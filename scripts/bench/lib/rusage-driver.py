# Runs processes for the benchmarks and reports, per process, wall time from spawn to exit and
# its own user and system CPU (wait4's rusage: exactly that child, not this driver, not Node).
# A long-lived driver so no interpreter start-up lands in what is measured.
#
# Protocol: one JSON request per line on stdin, {"jobs": [{"argv", "env", "input"}...]}; all
# jobs of a request start together (one job: a single call; 100: a node reboot's burst). One
# JSON reply per line on stdout: {"wallMs": first spawn to last exit, "results": [{"code",
# "wallMs", "userMs", "sysMs", "stdout", "stderr"}...]}. stdout/stderr go through temp files, so
# a burst can never fill a pipe and stall.

import json
import os
import sys
import tempfile
import time


def run(jobs):
    started = {}
    files = {}
    t0 = time.perf_counter()
    for i, job in enumerate(jobs):
        r, w = os.pipe()
        data = job.get("input", "").encode()
        # Our inputs are a few KiB, well under a pipe's 64 KiB: written before the child starts.
        os.write(w, data)
        os.close(w)
        out = tempfile.TemporaryFile()
        err = tempfile.TemporaryFile()
        actions = [
            (os.POSIX_SPAWN_DUP2, r, 0),
            (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
            (os.POSIX_SPAWN_DUP2, err.fileno(), 2),
        ]
        t = time.perf_counter()
        pid = os.posix_spawn(job["argv"][0], job["argv"], job["env"], file_actions=actions)
        os.close(r)
        started[pid] = (i, t)
        files[pid] = (out, err)
    results = [None] * len(jobs)
    while started:
        pid, status, ru = os.wait4(-1, 0)
        if pid not in started:
            continue
        i, t = started.pop(pid)
        wall = (time.perf_counter() - t) * 1000
        out, err = files.pop(pid)
        out.seek(0)
        err.seek(0)
        results[i] = {
            "code": os.waitstatus_to_exitcode(status),
            "wallMs": wall,
            "userMs": ru.ru_utime * 1000,
            "sysMs": ru.ru_stime * 1000,
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace")[-2000:],
        }
        out.close()
        err.close()
    return {"wallMs": (time.perf_counter() - t0) * 1000, "results": results}


for line in sys.stdin:
    if not line.strip():
        continue
    try:
        reply = run(json.loads(line)["jobs"])
    except Exception as e:  # a bad argv: the bench says which
        reply = {"error": repr(e)}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
