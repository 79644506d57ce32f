#!/usr/bin/env python3
"""Bytes each node got in a rollout, as JSON by host: files copied through Ansible's connection (the transfer log of
connection_plugins/podman_counted.py) and fetched from the mirror (nginx's access log, combined format).

    transfers.py TRANSFER_LOG MIRROR_LOG [MIRROR_LOG_BEFORE] --address HOST=IP ...

With MIRROR_LOG_BEFORE (the log as it was when the rollout started), only the requests after it count.
"""

import argparse
import collections
import json
import re

# combined: $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" ...
REQUEST = re.compile(r'^(\S+) \S+ \S+ \[[^]]*\] "(\S+) (\S+)[^"]*" (\d{3}) (\d+)')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("transfer_log")
    parser.add_argument("mirror_log")
    parser.add_argument("mirror_log_before", nargs="?")
    parser.add_argument("--address", action="append", default=[], help="HOST=IP of a node, as the mirror sees it")
    args = parser.parse_args()
    hosts = collections.defaultdict(lambda: {"put": 0, "mirror_bytes": 0, "mirror_requests": 0,
                                             "mirror_errors": 0})
    with open(args.transfer_log, encoding="utf-8") as log:
        for line in log:
            transfer = json.loads(line)
            hosts[transfer["host"]][transfer["kind"]] += transfer["bytes"]
    by_address = dict(reversed(pair.split("=", 1)) for pair in args.address)
    skip = 0
    if args.mirror_log_before:
        with open(args.mirror_log_before, encoding="utf-8") as log:
            skip = sum(1 for dummy in log)
    with open(args.mirror_log, encoding="utf-8") as log:
        for number, line in enumerate(log):
            match = REQUEST.match(line)
            if number < skip or not match or match.group(2) != "GET":
                continue
            host = hosts[by_address.get(match.group(1), match.group(1))]
            host["mirror_requests"] += 1
            host["mirror_bytes"] += int(match.group(5))
            host["mirror_errors"] += match.group(4) != "200"
    print(json.dumps(hosts, sort_keys=True))


if __name__ == "__main__":
    main()
