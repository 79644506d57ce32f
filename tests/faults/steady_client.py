#!/usr/bin/env python3
"""One client that streams chat completions without a pause until a file appears: a rollout's whole length.

    steady_client.py --url http://HOST:PORT --key KEY --until FILE [--model NAME]

Each request has a prompt of its own and must answer 200 and end with [DONE] (abuse.py's well-behaved client); the
model is the first one /v1/models names unless given. Prints one JSON line: how many streams ran, how many ended
whole, and each one that did not (its status: 0 for a failed connection; done false for a cut stream). Exits 1 when
any did not, or none ran.
"""

import argparse
import json
import os
import sys
import threading
import time

from abuse import good_client, request


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the endpoint's base URL (a balancer or one host's proxy)")
    parser.add_argument("--key", required=True, help="a client key the endpoint accepts")
    parser.add_argument("--until", required=True, help="stop once this file exists")
    parser.add_argument("--model", help="the served model name (default: the first of /v1/models)")
    args = parser.parse_args()
    model = args.model
    if model is None:
        status, data = request(args.url, "/v1/models", None, args.key, method="GET", raw=b"")
        if status != 200:
            print(json.dumps({"error": f"GET /v1/models answered {status}"}))
            return 1
        model = json.loads(data)["data"][0]["id"]
    stop, streams = threading.Event(), []
    client = threading.Thread(target=good_client, args=(args.url, args.key, model, stop, streams))
    started = time.monotonic()
    client.start()
    while not os.path.exists(args.until):
        time.sleep(0.5)
    stop.set()
    client.join()
    bad = [stream for stream in streams if not stream["done"]]
    print(json.dumps({"streams": len(streams), "whole": len(streams) - len(bad), "not_whole": bad,
                      "seconds": round(time.monotonic() - started, 1), "model": model}))
    return 1 if bad or not streams else 0


if __name__ == "__main__":
    sys.exit(main())
