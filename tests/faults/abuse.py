#!/usr/bin/env python3
"""Bad and abusive requests to the proxy while a well-behaved client streams (issue #20's inputs).

    abuse.py --url http://127.0.0.1:8080 --key KEY --model NAME [--rounds 3] [--idle 200]

A well-behaved client streams chat completions one after another (unique prompts) for as long as the abuse lasts.
Beside it, for --rounds rounds: malformed bodies, wrong keys, an output length of 10^9 tokens, a body over the size
limit, the engine's admin endpoints, a non-streamed and a streamed request whose clients give up after 0.5 s or the
first event, and --idle connections opened and left silent. Standard library only (runs on the node's python3).

Prints one JSON line: the good client's streams and failures, per abusive input the statuses it got, and how often
llama-server (its /metrics through the proxy) stopped generating within 3 s for a client that had gone. Exits 1
when the good client saw any failure, an input got a status other than its expected one, or the engine went on
generating for a client that had gone.
"""

import argparse
import http.client
import json
import socket
import sys
import threading
import time
import urllib.parse

CHAT = "/v1/chat/completions"


def request(base, path, body, key, method="POST", raw=None, timeout=120):
    """Status of one request (0 when the connection failed) and its body."""
    parts = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = "Bearer " + key
    try:
        conn.request(method, path, body=raw if raw is not None else json.dumps(body), headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def give_up(base, key, body, after_s=None):
    """Send BODY and close the connection after AFTER_S seconds, or after the first streamed event."""
    parts = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=after_s or 60)
    try:
        conn.request("POST", CHAT, body=json.dumps(body), headers={"Content-Type": "application/json",
                                                                   "Authorization": "Bearer " + key})
        resp = conn.getresponse()
        resp.readline()
        return resp.status
    except socket.timeout:
        return "gave up"
    except OSError:
        return 0
    finally:
        conn.close()


def engine_idle(base, key, busy_allowed=1, wait_s=5.0):
    """Whether llama-server's requests in flight (its /metrics gauge llamacpp:requests_processing, through the
    proxy with the key) fall to BUSY_ALLOWED (the good client's) within WAIT_S seconds: a client that gave up does
    not keep the engine generating."""
    deadline = time.monotonic() + wait_s
    while True:
        status, data = request(base, "/metrics", None, key, method="GET")
        busy = [float(line.split()[-1]) for line in data.decode(errors="replace").splitlines()
                if line.startswith("llamacpp:requests_processing")]
        if status == 200 and busy and busy[0] <= busy_allowed:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)


def gone(base, key, body, after_s, tally):
    """give_up, then count in TALLY whether the engine stopped that generation within 3 s."""
    status = give_up(base, key, body, after_s)
    tally["stopped" if engine_idle(base, key, wait_s=3.0) else "still generating"] += 1
    return status


def good_client(base, key, model, stop, results):
    """Stream chat completions until STOP is set; each must answer 200 and end with [DONE]."""
    n = 0
    while not stop.is_set():
        n += 1
        body = {"model": model, "stream": True, "max_tokens": 16,
                "messages": [{"role": "user", "content": f"Request {n} at {time.time()}: name a prime number."}]}
        status, data = request(base, CHAT, body, key, timeout=300)
        done = status == 200 and b"data: [DONE]" in data
        results.append({"status": status, "done": done})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the proxy's base URL")
    parser.add_argument("--key", required=True, help="a client key the proxy accepts")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=int, default=200, help="idle connections held open during the abuse")
    parser.add_argument("--body-limit", type=int, default=256 * 1024, help="bytes nginx accepts in a body")
    args = parser.parse_args()
    key, model = args.key, args.model
    tally = {"stopped": 0, "still generating": 0}
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    # (name, expected status, call)
    inputs = [
        ("no messages", 400, lambda: request(args.url, CHAT, {"model": model, "max_tokens": 4}, key)[0]),
        ("messages a string", 400, lambda: request(args.url, CHAT, dict(chat, messages="hello"), key)[0]),
        ("max_tokens -1", 400, lambda: request(args.url, CHAT, dict(chat, max_tokens=-1), key)[0]),
        ("max_tokens abc", 400, lambda: request(args.url, CHAT, dict(chat, max_tokens="abc"), key)[0]),
        ("max_tokens 10^9", 400, lambda: request(args.url, CHAT, dict(chat, max_tokens=10**9), key)[0]),
        ("body not JSON", 400, lambda: request(args.url, CHAT, None, key, raw=b'{"messages": [')[0]),
        ("body over the limit", 413,
         lambda: request(args.url, CHAT, None, key, raw=b"x" * (args.body_limit + 1))[0]),
        ("no key", 401, lambda: request(args.url, CHAT, chat, None)[0]),
        ("key upper-cased", 401, lambda: request(args.url, CHAT, chat, key.upper())[0]),
        ("key swapped case", 401, lambda: request(args.url, CHAT, chat, key.swapcase())[0]),
        ("key one character short", 401, lambda: request(args.url, CHAT, chat, key[:-1])[0]),
        ("admin /reset", 404, lambda: request(args.url, "/reset", {}, key)[0]),
        ("admin /slots", 404, lambda: request(args.url, "/slots", None, key, method="GET")[0]),
        ("non-streamed, client gone after 0.5 s", "gave up",
         lambda: gone(args.url, key, dict(chat, max_tokens=256, ignore_eos=True), 0.5, tally)),
        ("streamed, client gone after the first event", 200,
         lambda: gone(args.url, key, dict(chat, max_tokens=256, ignore_eos=True, stream=True), None, tally)),
    ]

    stop, good = threading.Event(), []
    streamer = threading.Thread(target=good_client, args=(args.url, key, model, stop, good))
    streamer.start()
    parts = urllib.parse.urlsplit(args.url)
    idle = []
    for _ in range(args.idle):
        try:
            idle.append(socket.create_connection((parts.hostname, parts.port), timeout=10))
        except OSError:
            break
    got = {name: [] for name, _, _ in inputs}
    for _ in range(args.rounds):
        for name, _, call in inputs:
            got[name].append(call())
    for conn in idle:
        conn.close()
    # The good client's last stream ends after the abuse: it shows the engine was not left generating for a
    # client that had gone.
    stop.set()
    streamer.join()
    failed = [g for g in good if not g["done"]]
    wrong = {name: got[name] for name, want, _ in inputs if any(status != want for status in got[name])}
    print(json.dumps({"good_streams": len(good), "good_failed": failed, "idle_connections": len(idle),
                      "inputs": {name: got[name] for name, _, _ in inputs}, "unexpected": wrong,
                      "generation_after_client_gone": tally}))
    return 1 if failed or wrong or not good or tally["still generating"] else 0


if __name__ == "__main__":
    sys.exit(main())
