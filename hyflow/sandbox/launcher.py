"""The first program inside the sandbox: drop to the run's own user (when started as root), set the resource limits,
then replace itself with the real program. Runs as `python -I -S -c <this file> SPEC_JSON PROGRAM ARGS...`, so it
uses the standard library only and does not import hyflow.

SPEC_JSON: {"uid": int | null, "rlimits": {"RLIMIT_CPU": n, ...}}. The limits are set here, after bubblewrap has
started its processes, so `RLIMIT_NPROC` counts only what the program starts.
"""

import json
import os
import resource
import sys


def main() -> None:
    spec = json.loads(sys.argv[1])
    program = sys.argv[2:]
    if spec["uid"] is not None:  # bwrap ran as root: become an unprivileged user with no capabilities left
        os.setgroups([])
        os.setgid(spec["uid"])
        os.setuid(spec["uid"])
    for name, value in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    os.execv(program[0], program)


if __name__ == "__main__":
    main()
