#!/usr/bin/env python3
"""The failed and unreachable tasks of each rollout in rollout.json (converge.yml keeps the JSON callback's report of
every rollout there), one line each: the rollout, the play, the task, the host and the message.

    failures.py ROLLOUT_JSON

A failure where the test expects none is placed by these lines alone: the nested runs print nothing else.
"""

import argparse
import json


def failures(run):
    """(play, task, host, message) of every failed or unreachable task result in one JSON callback report."""
    for play in run.get("plays", []):
        for task in play.get("tasks", []):
            for host, result in task.get("hosts", {}).items():
                if result.get("failed") or result.get("unreachable"):
                    message = result.get("msg") or result.get("stderr") or result.get("reason") or ""
                    yield play["play"]["name"], task["task"]["name"], host, " ".join(str(message).split())[:400]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rollout_json")
    args = parser.parse_args()
    with open(args.rollout_json, encoding="utf-8") as report:
        rollouts = json.load(report)
    for name, rollout in rollouts.items():
        if "run" not in rollout:
            continue
        for play, task, host, message in failures(rollout["run"]):
            print(f"{name}: {play} / {task} / {host}: {message}")


if __name__ == "__main__":
    main()
