#!/usr/bin/env python3
"""Kill ``ansible-playbook`` at a random task of one play, as a lost SSH session or an operator's kill -9 would.

    interrupt.py --play "Tune the OS" [--tasks N] [--seed S] -- ansible-playbook -i INV playbook.yml [-e ...]

Runs the command in its own process group with the default stdout callback and counts the ``TASK [...]`` headers
printed after the header of the play named ``--play``. At the K-th of them (K drawn uniformly from 1 to N with
``--seed``, or a fresh seed), it waits a random 0-2 s, so the kill lands inside the task rather than at its start,
and sends SIGKILL to the whole group: no handler, rescue or ``always`` runs, as with a real kill.

N is ``--tasks``, or the tasks of that play in ``ansible-playbook --list-tasks`` (tasks that roles include at run
time are not listed there: pass N when they matter). Prints one JSON line: seed, K, N, the task killed in, the
seconds the run had lasted, and the run's exit status (-9 when killed, or its own code when it ended before task K).
Exits 0 when the run was killed, 1 when it ended first.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

TASK = re.compile(r"^TASK \[(.*)\] \*+$")
PLAY = re.compile(r"^PLAY \[(.*)\] \*+$")


def listed_tasks(command, play):
    """Number of tasks ``ansible-playbook --list-tasks`` lists under the play named PLAY."""
    out = subprocess.run(command + ["--list-tasks"], check=True, capture_output=True, text=True).stdout
    count, inside = 0, False
    for line in out.splitlines():
        header = re.match(r"^\s*play #\d+ \(.*\): (.*?)\tTAGS:", line)
        if header:
            inside = header.group(1) == play
        elif inside and "\tTAGS:" in line:
            count += 1
    if not count:
        raise SystemExit(f"no tasks listed under the play {play!r}")
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--play", required=True, help="name of the play whose tasks may be interrupted")
    parser.add_argument("--tasks", type=int, help="tasks of that play (default: from --list-tasks)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, printed)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ansible-playbook ...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    total = args.tasks or listed_tasks(command, args.play)
    target = rng.randint(1, total)
    delay = rng.uniform(0, 2)

    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PYTHONUNBUFFERED="1")
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    seen, inside, task = 0, False, None
    for line in proc.stdout:
        line = line.rstrip("\n")
        play = PLAY.match(line)
        if play:
            inside = play.group(1) == args.play
            continue
        header = TASK.match(line)
        if inside and header:
            seen += 1
            if seen == target:
                task = header.group(1)
                time.sleep(delay)
                os.killpg(proc.pid, signal.SIGKILL)
                break
    rc = proc.wait()
    proc.stdout.close()
    print(json.dumps({"seed": seed, "task_number": target, "tasks": total, "task": task,
                      "killed_after_s": round(time.monotonic() - start, 1), "rc": rc}))
    return 0 if task is not None else 1


if __name__ == "__main__":
    sys.exit(main())
