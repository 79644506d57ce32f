#!/usr/bin/env python3
"""Kill ``ansible-playbook`` at a random task of one play, as a lost SSH session or an operator's kill -9 would.

    interrupt.py --play "Tune the OS" [--tasks N | --tasks-from-check] [--seed S] \
        -- ansible-playbook -i INV playbook.yml [-e ...]

Runs the command in its own process group with the default stdout callback and counts the ``TASK [...]`` and
``RUNNING HANDLER [...]`` headers printed after the header of the play named ``--play`` (handlers count: a kill
inside a handler's restart is the case that leaves a stale service, and the JSON callback, whose report gives
``--tasks`` in the molecule scenarios, records handlers as tasks). At the K-th of them (K drawn uniformly from 1 to N with
``--seed``, or a fresh seed), it waits a random 0-2 s, so the kill lands inside the task rather than at its start,
and sends SIGKILL to the whole group: no handler, rescue or ``always`` runs, as with a real kill. Descendants that left
the group (Mitogen's mux process, in a session of its own) get SIGKILL too, so no test leaves them behind.

N is ``--tasks``; or, with ``--tasks-from-check``, the task headers of that play in a run of the same command with
``--check`` first (what roles include at run time is counted; a task that check mode steers elsewhere may make N
differ a little from the real run's); or the tasks of that play in ``ansible-playbook --list-tasks`` (tasks that roles
include at run time are not listed there, nor are handlers). Prints one JSON line: seed, K, N, the task killed in,
the headers seen, the seconds the run had lasted, and the run's exit status (-9 when killed, or its own code when it
ended before task K).
Exits 0 when the run was killed, 1 when it ended first.
"""

import argparse
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

TASK = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(.*)\] \*+$")
PLAY = re.compile(r"^PLAY \[(.*)\] \*+$")


def process_tree(pid):
    """PID and its live descendants: module_utils/llmtune_cpuload.py's, loaded from its file, since the tests import
    this script and a module_utils folder on their sys.path would shadow library/'s modules of the same name."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils", "llmtune_cpuload.py")
    spec = importlib.util.spec_from_file_location("llmtune_cpuload", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.process_tree(pid)


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


def play_tasks(lines, play):
    """Yield the name of each task and handler header printed under the play named PLAY, from output LINES."""
    inside = False
    for line in lines:
        line = line.rstrip("\n")
        header = PLAY.match(line)
        if header:
            inside = header.group(1) == play
            continue
        header = TASK.match(line)
        if inside and header:
            yield header.group(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--play", required=True, help="name of the play whose tasks may be interrupted")
    parser.add_argument("--tasks", type=int, help="tasks of that play (default: from --list-tasks)")
    parser.add_argument("--tasks-from-check", action="store_true",
                        help="count the tasks of that play in a --check run of the command first")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, printed)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ansible-playbook ...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    # Skipped and ok tasks shown: otherwise the default callback prints a header only with a result to show.
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_DISPLAY_SKIPPED_HOSTS="1",
               ANSIBLE_DISPLAY_OK_HOSTS="1", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1")
    if args.tasks:
        total = args.tasks
    elif args.tasks_from_check:
        check = subprocess.run(command + ["--check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env, check=False)
        total = sum(1 for _ in play_tasks(check.stdout.splitlines(), args.play))
        if check.returncode or not total:
            raise SystemExit(f"the --check run ended {check.returncode} with {total} tasks under {args.play!r}:\n"
                             + check.stdout[-3000:])
    else:
        total = listed_tasks(command, args.play)
    target = rng.randint(1, total)
    delay = rng.uniform(0, 2)

    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    task, seen = None, 0
    for name in play_tasks(proc.stdout, args.play):
        seen += 1
        if seen == target:
            task = name
            time.sleep(delay)
            tree = process_tree(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in tree[1:]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
    rc = proc.wait()
    proc.stdout.close()
    print(json.dumps({"seed": seed, "task_number": target, "tasks": total, "task": task,
                      "seen": seen, "killed_after_s": round(time.monotonic() - start, 1), "rc": rc}))
    return 0 if task is not None else 1


if __name__ == "__main__":
    sys.exit(main())
