"""Hostile programs several evaluator tests run: a fork bomb, descendants that escape the process group,
and the prelude that finds the harness's status fd."""

from __future__ import annotations

FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
SETSID_ESCAPE = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
print(3)
"""

# An escapee with a chain of descendants: killing each re-parents the next to the worker, after the sweep
# that found it (the program waits until the whole chain exists).
NESTED_ESCAPE = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    for _ in range(4):
        if os.fork() != 0:
            time.sleep(1000)
    os.write(w, b"x")
    time.sleep(1000)
os.read(r, 1)
print(3)
"""

HOLDS_STDOUT = """
import subprocess
subprocess.Popen(["sleep", "1000"], start_new_session=True)  # inherits stdout and never exits
print(3)
"""

# The status fd's number, read from the harness's command line (its one JSON argument).
STATUS_FD = """
import json, os
config = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")[4]
fd = json.loads(config)["status_fd"]
"""
