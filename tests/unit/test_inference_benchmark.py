"""library/inference_benchmark.py against the real `transformers serve` running a proxy model (no mocks)."""

import fcntl
import http.server
import json
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

import psutil
import pytest

import transformers  # noqa: E402,F401  (the real engine serves the tests)

import inference_benchmark as bench  # noqa: E402  (library/ is on sys.path via conftest)
from conftest import ROOT, VENV_BIN, engine_pid, free_port  # noqa: E402

SO_TIMESTAMPNS = 35  # asm-generic/socket.h (x86-64, arm64); Python's socket module does not export it
PROMPTS = ["What is the capital of Australia?", "请用一句话解释什么是人工智能。", "Why is the sky blue?"]


def params(**overrides):
    """Module options with the module's own defaults, as AnsibleModule would fill them."""
    values = {name: spec.get("default") for name, spec in bench.ARGUMENT_SPEC.items()}
    # No waiting for a quiet host: the suite runs beside linters and builds; one 2-second window is still taken.
    # No host-wide lock (lock_path): the lock tests give their own.
    values.update(prompts=PROMPTS, max_tokens=12, requests=3, warmup=0, timeout=60, settle_timeout=0, lock_path="")
    values.update(overrides)
    return values


@pytest.fixture(scope="module")
def model_id(inference_server, tiny_proxy_dir):
    return str(tiny_proxy_dir)


@pytest.fixture(scope="module")
def run_1_2(inference_server, model_id, tmp_path_factory):
    """One real run at concurrency 1 and 2 (shared by the shape tests to keep the file fast)."""
    report = tmp_path_factory.mktemp("bench") / "sub" / "report.json"
    result, failure, warnings = bench.run(params(url=inference_server, concurrency=[1, 2], warmup=1,
                                                 report_path=str(report)))
    return result, failure, warnings, report


def test_result_shape_and_real_values(run_1_2, inference_server, model_id, tiny_proxy_dir):
    result, failure, _warnings, report = run_1_2
    assert failure is None
    assert result["changed"] is False
    assert (result["url"], result["model"], result["max_tokens"]) == (inference_server, model_id, 12)
    assert result["token_count_source"] == "usage"
    assert [level["concurrency"] for level in result["levels"]] == [1, 2]
    for level in result["levels"]:
        assert (level["requests"], level["errors"], level["error_messages"]) == (3, 0, [])
        # Random weights practically never sample an end-of-sequence token: every request hits max_tokens.
        assert level["output_tokens"] == 36
        assert [s["output_tokens"] for s in level["samples"]] == [12, 12, 12]
        assert 0 < level["ttft_ms"]["p50"] <= level["ttft_ms"]["p95"] <= level["ttft_ms"]["p99"]
        assert 0 < level["itl_ms"]["p50"] <= level["itl_ms"]["p95"]
        assert level["e2e_ms"]["p50"] > level["ttft_ms"]["p50"]
        for sample in level["samples"]:
            decode_s = (sample["e2e_ms"] - sample["ttft_ms"]) / 1000
            assert sample["decode_tokens_per_s"] == pytest.approx(11 / decode_s, rel=1e-3)
        assert level["decode_tokens_per_s"]["mean"] == pytest.approx(
            statistics.fmean(s["decode_tokens_per_s"] for s in level["samples"]), rel=1e-3)
        assert level["output_tokens_per_s"] == pytest.approx(36 / level["wall_s"], rel=1e-2)
        assert level["requests_per_s"] == pytest.approx(3 / level["wall_s"], rel=1e-2)
    # The server's prompt token counts are those of the real tokenizer and chat template.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_proxy_dir)
    # Level 1 follows the warm-up request (prompt 0): prompts 1 to 3, the last one a second round of PROMPTS[0].
    # Tagged with the run's own prompt seed: no prompt of an earlier run.
    sent = [bench.prompt_for(params(prompt_seed=result["prompt_seed"]), i) for i in (1, 2, 3)]
    tags = [bench.run_tag(result["prompt_seed"], i) + ". " for i in (1, 2, 3)]
    assert sent == [tags[0] + PROMPTS[1], tags[1] + PROMPTS[2], tags[2] + "(2) " + PROMPTS[0]]
    # A tag shared by the run would be a cached prefix of every request: each request's starts with its own word.
    assert len({prompt.split()[0] for prompt in sent}) == 3
    lengths = [len(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                 return_dict=True)["input_ids"]) for p in sent]
    assert result["levels"][0]["prompt_tokens_mean"] == round(statistics.fmean(lengths), 1)
    level1 = result["levels"][0]
    assert result["summary"] == {
        "concurrency": 1, "ttft_ms_p50": level1["ttft_ms"]["p50"], "ttft_ms_p95": level1["ttft_ms"]["p95"],
        "itl_ms_p50": level1["itl_ms"]["p50"], "tpot_ms_p50": level1["tpot_ms"]["p50"],
        "e2e_ms_p50": level1["e2e_ms"]["p50"], "decode_tokens_per_s": level1["decode_tokens_per_s"]["p50"],
        "decode_tokens_per_s_mean": level1["decode_tokens_per_s"]["mean"],
        "output_tokens_per_s": level1["output_tokens_per_s"], "requests_per_s": level1["requests_per_s"],
        "errors": 0}
    assert result["gain"] == {}
    assert result["host_load"]["cpus"] == os.cpu_count()
    assert len(result["host_load"]["loadavg_before"]) == len(result["host_load"]["loadavg_after"]) == 3
    assert json.loads(report.read_text()) == result
    with open("/proc/cmdline", encoding="utf-8") as handle:
        assert result["host_state"]["kernel_cmdline"] == handle.readline().strip()
    assert result["host_state"]["tuned_settings"] == []


def test_host_state_names_the_tuning_in_place(tmp_path):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"settings": {"thp.enabled": {"original": "always [madvise] never"},
                                              "cpufreq.governor.cpu0": {"original": "schedutil"}}}))
    assert bench.host_state(str(state))["tuned_settings"] == ["cpufreq.governor.cpu0", "thp.enabled"]
    assert bench.host_state(str(tmp_path / "absent.json"))["tuned_settings"] == []
    state.write_text("[]")
    assert bench.host_state(str(state))["tuned_settings"] == [f"unreadable {state}: {state} is not a JSON object"]


def test_percentiles_are_inclusive_quantiles():
    assert bench.percentiles([10.0, 20.0, 30.0, 40.0], (50, 95, 99)) == {"p50": 25.0, "p95": 38.5, "p99": 39.7}
    assert bench.percentiles([7.0], (50, 95)) == {"p50": 7.0, "p95": 7.0}
    assert bench.percentiles([], (50,)) == {"p50": None}


def test_gain_against_a_baseline(run_1_2):
    result = run_1_2[0]
    summary = result["summary"]
    baseline = {"summary": dict(summary, ttft_ms_p50=summary["ttft_ms_p50"] * 2,
                                decode_tokens_per_s=summary["decode_tokens_per_s"] / 2)}
    gain = bench.gains(summary, baseline)
    assert gain["ttft_ms_p50"] == 2.0  # half the latency of the baseline: twice as good
    assert gain["decode_tokens_per_s"] == 2.0
    assert gain["output_tokens_per_s"] == 1.0
    assert "errors" not in gain and "concurrency" not in gain


def test_fail_below_names_the_figure(inference_server, model_id):
    baseline = {"summary": {"decode_tokens_per_s": 1000000.0, "ttft_ms_p50": 0.001}}
    result, failure, _ = bench.run(params(url=inference_server, model=model_id, requests=2, baseline=baseline,
                                          fail_below={"decode_tokens_per_s": 0.9}))
    new = result["summary"]["decode_tokens_per_s"]
    ratio = result["gain"]["decode_tokens_per_s"]
    assert ratio == round(new / 1000000.0, 4) and ratio < 0.9
    assert failure == (f"below baseline: decode_tokens_per_s {new} vs baseline 1000000.0: ratio {ratio} < 0.9")
    assert result["levels"][0]["errors"] == 0
    # Every figure worse than the baseline is named with how much, fail_below or not.
    worse = {item["figure"]: item for item in result["worse"]}
    assert set(worse) == {"decode_tokens_per_s", "ttft_ms_p50"}
    assert worse["decode_tokens_per_s"]["percent"] == round(100 * (1000000.0 / new - 1), 1)
    assert worse["ttft_ms_p50"] == {"figure": "ttft_ms_p50", "name": "TTFT p50", "baseline": 0.001,
                                    "new": result["summary"]["ttft_ms_p50"],
                                    "percent": round(100 * (result["summary"]["ttft_ms_p50"] / 0.001 - 1), 1)}


@pytest.mark.parametrize("options, message", [
    ({"fail_below": {"decode_tokens_per_s": 0.9}}, "fail_below needs a baseline to compare with"),
    ({"fail_below": {"tokens": 0.9}, "baseline": {"summary": {}}},
     "fail_below: unknown figure(s) tokens; choose from ttft_ms_p50, ttft_ms_p95, itl_ms_p50, tpot_ms_p50, "
     "e2e_ms_p50, decode_tokens_per_s, decode_tokens_per_s_mean, output_tokens_per_s, requests_per_s"),
    ({"fail_below": {"ttft_ms_p50": "fast"}, "baseline": {"summary": {}}},
     "fail_below.ttft_ms_p50 must be a number > 0 (a ratio to the baseline), got 'fast'"),
    ({"concurrency": [0]}, "concurrency must be a non-empty list of integers >= 1"),
    ({"url": "127.0.0.1:8000"}, "url must be http(s)://host[:port], got '127.0.0.1:8000'"),
    ({"more_urls": ["127.0.0.1:8001"]}, "url must be http(s)://host[:port], got '127.0.0.1:8001'"),
    ({"more_urls": ["http://127.0.0.1:8001"], "twin_url": "http://127.0.0.1:8100"},
     "more_twin_urls: one twin per engine of more_urls (1), got 0"),
    ({"more_twin_urls": ["http://127.0.0.1:8101"]}, "more_twin_urls needs twin_url, the twin of url"),
    ({"more_urls": ["http://127.0.0.1:8001"], "twin_url": "http://127.0.0.1:8100",
      "more_twin_urls": ["http://127.0.0.1:8001/"]}, "every twin must be a server of its own, none of url and more_urls"),
    ({"more_urls": ["http://127.0.0.1:8001"], "twin_url": "http://127.0.0.1:8100",
      "more_twin_urls": ["http://127.0.0.1:8100"]}, "every twin must be a server of its own, none of url and more_urls"),
    ({"more_engine_pids": [12]}, "more_engine_pids: at most one PID >= 0 per engine of more_urls"),
    ({"more_urls": ["http://127.0.0.1:8001"], "twin_url": "http://127.0.0.1:8100",
      "more_twin_urls": ["http://127.0.0.1:8101"], "more_twin_engine_pids": [-1]},
     "more_twin_engine_pids: at most one PID >= 0 per engine of more_twin_urls"),
])
def test_bad_options_fail_before_any_request(options, message):
    result, failure, _ = bench.run(params(model="m", **options))
    assert failure == message
    assert "levels" not in result


def test_unreachable_url_counts_errors_and_fails(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    good = tmp_path / "baseline.json"
    good.write_text('{"summary": {"decode_tokens_per_s": 9.5}}\n')
    result, failure, _ = bench.run(params(url=url, model="m", requests=2, report_path=str(good)))
    # A failed measurement never replaces a good one.
    assert good.read_text() == '{"summary": {"decode_tokens_per_s": 9.5}}\n'
    assert "report_path" not in result
    assert result["levels"][0]["errors"] == 2
    assert result["levels"][0]["ttft_ms"] == {"p50": None, "p95": None, "p99": None}
    assert failure == (f"all 2 requests at concurrency 1 to {url} failed: "
                       "ConnectionRefusedError: [Errno 111] Connection refused")
    result, failure, _ = bench.run(params(url=url, model=None))
    assert failure.startswith(f"cannot list models at {url}/v1/models ([Errno 111] Connection refused)")


@pytest.fixture
def replayed_stream():
    """An HTTP server that answers every chat completion with a recorded stream of a real engine."""
    body = open(os.path.join(ROOT, "tests", "fixtures", "benchmark", "transformers-serve-24-of-32.sse"), "rb").read()

    class Replay(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802  (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_stream_that_ends_early_fails_when_the_length_was_asked(replayed_stream):
    """The input CI met: transformers serve ended an answer at its end-of-sequence token after 24 of 32 tokens. Asked
    for exactly 32 (ignore_eos), the request fails naming what the engine returned; not asked, its 24 tokens count."""
    result, failure, _ = bench.run(params(url=replayed_stream, model="m", max_tokens=32, ignore_eos=True, requests=2))
    assert result["levels"][0]["errors"] == 2
    assert failure == (f"all 2 requests at concurrency 1 to {replayed_stream} failed: the engine returned 24 of the 32 "
                       "output tokens asked for (finish_reason stop) although ignore_eos was sent")
    result, failure, _ = bench.run(params(url=replayed_stream, model="m", max_tokens=32, ignore_eos=False, requests=2))
    assert failure is None
    assert [sample["output_tokens"] for sample in result["levels"][0]["samples"]] == [24, 24]


def test_check_mode_sends_nothing(tmp_path):
    report = tmp_path / "r.json"
    result, failure, _ = bench.run(params(url=f"http://127.0.0.1:{free_port()}", report_path=str(report)),
                                   check_mode=True)
    assert (result, failure) == ({"changed": False, "skipped": True, "msg": "check mode: no request sent"}, None)
    assert not report.exists()


class TimingRelay:
    """A TCP relay in front of the server that timestamps the bytes it forwards, one record per connection.

    It times the very same requests the module makes, independently of the module's HTTP and SSE code.
    Times are CLOCK_REALTIME seconds: the request's arrival is the kernel's receive timestamp (SO_TIMESTAMPNS,
    socket(7)), so the relay's own thread wake-ups do not shift it; a response piece is timed right after it
    has been handed to the module's socket, the moment the module can read it.
    """

    def __init__(self, upstream_port, delay_s=0.0):
        self.upstream_port, self.delay_s = upstream_port, delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections, self.pumps = [], []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            client.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for sock in (client, upstream):  # forward each SSE event at once, as the server itself does
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            record = {"accepted_at": time.time(), "request_at": None, "chunks": [], "sent": b""}
            self.connections.append(record)
            for pump, args in ((self._requests, (client, upstream, record)),
                               (self._responses, (upstream, client, record))):
                self.pumps.append(threading.Thread(target=pump, args=args, daemon=True))
                self.pumps[-1].start()

    @staticmethod
    def _requests(client, upstream, record):
        while True:
            data, ancillary, _flags, _addr = client.recvmsg(65536, socket.CMSG_SPACE(16))
            if not data:
                break
            for level, kind, value in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS) and record["request_at"] is None:
                    seconds, nanoseconds = struct.unpack("qq", value)
                    record["request_at"] = seconds + nanoseconds / 1e9
            record["sent"] += data
            upstream.sendall(data)
        upstream.shutdown(socket.SHUT_WR)

    def _responses(self, upstream, client, record):
        while True:
            data = upstream.recv(65536)
            if not data:
                break
            # A slower service, for the tests of the paired gap: each SSE event held, so every token is late even
            # when a loaded machine hands the relay several at once.
            for piece in re.split(b"(?=data: )", data) if self.delay_s else [data]:
                if piece:
                    time.sleep(self.delay_s)
                    client.sendall(piece)
                    record["chunks"].append((time.time(), piece))
        client.shutdown(socket.SHUT_WR)

    def close(self):
        """Stop accepting and wait until every connection is closed, so all records are complete."""
        self.listener.close()
        for pump in self.pumps:
            pump.join(timeout=10)


def relay_timing(record):
    """(ttft_ms, decode_tokens_per_s, completion_tokens) of one recorded streaming response."""
    raw = b"".join(data for _, data in record["chunks"])
    ends = []  # raw byte offset at which each received piece ends, with its arrival time
    offset = 0
    for at, data in record["chunks"]:
        offset += len(data)
        ends.append((offset, at))

    def arrival(raw_offset):
        return next(at for end, at in ends if end > raw_offset)

    head_end = raw.index(b"\r\n\r\n") + 4
    assert b"transfer-encoding: chunked" in raw[:head_end].lower()
    first, tokens, pos = None, None, head_end
    while True:  # HTTP/1.1 chunked body: "<hex size>\r\n<data>\r\n", one SSE event per chunk here
        line_end = raw.index(b"\r\n", pos)
        size = int(raw[pos:line_end], 16)
        if size == 0:
            break
        data = raw[line_end + 2:line_end + 2 + size]
        for line in data.split(b"\n"):
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                if first is None and any((c.get("delta") or {}).get("content") for c in event["choices"]):
                    first = arrival(line_end + 2 + size - 1)
                tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
        pos = line_end + 2 + size + 2
    last = ends[-1][1]
    # None when the relay read every token at once (woken after the engine had sent them): no decode time to compare.
    decode = (tokens - 1) / (last - first) if last > first else None
    return (first - record["request_at"]) * 1000, decode, tokens


def test_ttft_and_decode_speed_agree_with_independent_timing(inference_server, model_id):
    """The module's TTFT and decode tokens/s p50 within 5 % of the relay's for the same requests.

    The suite runs this beside linters and a VM: a run disturbed by them (a thread woken late on a full machine, a
    relay that read a whole response at once) is measured again, at most three times, as the benchmark itself
    re-measures a noisy level; a systematic error fails every attempt. TTFT may also differ by 2 ms: the module's
    clock runs from before its connect and send, the relay's from the request's arrival, and on a loaded machine
    that took 1.2-1.3 ms, 7-9 % of the tiny proxy's 16 ms TTFT, in every attempt of a CI run (a 1024-token prompt
    only raised that TTFT to 24 ms).
    """
    attempts = []
    for _ in range(3):
        relay = TimingRelay(int(inference_server.rsplit(":", 1)[1]))
        try:
            result, failure, _ = bench.run(params(url=f"http://127.0.0.1:{relay.port}", model=model_id, requests=5,
                                                  max_tokens=16, warmup=1, timeout=20))
        finally:
            relay.close()
        assert failure is None
        samples = result["levels"][0]["samples"]
        measured = [relay_timing(record) for record in relay.connections[1:]]  # [0] is the warmup request
        assert [m[2] for m in measured] == [s["output_tokens"] for s in samples] == [16] * 5
        if any(m[1] is None for m in measured):
            attempts.append("the relay read a whole response at once")
            continue
        level = result["levels"][0]
        figures = {"ttft_ms": (level["ttft_ms"]["p50"], statistics.median(m[0] for m in measured)),
                   "decode_tokens_per_s": (level["decode_tokens_per_s"]["p50"],
                                           statistics.median(m[1] for m in measured))}
        attempts.append(figures)
        absolute = {"ttft_ms": 2.0, "decode_tokens_per_s": 0.0}
        if all(module == pytest.approx(relay_figure, rel=0.05, abs=absolute[name])
               for name, (module, relay_figure) in figures.items()):
            break
    else:
        pytest.fail(f"module vs relay (p50) disagree by more than 5 % (TTFT: or 2 ms) in every attempt: {attempts}")


def sent_prompt(record):
    """The user message of the chat completion a relay record carried."""
    body = record["sent"].split(b"\r\n\r\n", 1)[1]
    return json.loads(body)["messages"][0]["content"]


@pytest.mark.parametrize("workload", [{"prompts": PROMPTS}, {"prompts": None, "prompt_tokens": 24}])
def test_every_request_of_a_run_sends_its_own_prompt(inference_server, model_id, workload):
    """No request may be a prompt-cache hit of another: warm-up and every level included (llama.cpp reuses a
    slot's longest common prefix; a repeated prompt measured a 34 ms TTFT where a new one took 1.4 s)."""
    relay = TimingRelay(int(inference_server.rsplit(":", 1)[1]))
    try:
        result, failure, _ = bench.run(params(url=f"http://127.0.0.1:{relay.port}", model=model_id, max_tokens=2,
                                              warmup=2, requests=3, concurrency=[1, 2], **workload))
    finally:
        relay.close()
    assert failure is None
    sent = sorted(sent_prompt(record) for record in relay.connections)
    assert len(sent) == 8 and len(set(sent)) == 8
    seed = result["prompt_seed"]
    assert sent == sorted(bench.prompt_for(params(prompt_seed=seed, **workload), i) for i in range(8))
    if workload.get("prompt_tokens"):
        # Synthetic prompts do not even share their first word.
        assert len({prompt.split()[0] for prompt in sent}) == 8
    # The same seed gives the same sequence: a run can be repeated.
    assert [bench.prompt_for(params(prompt_seed=seed, **workload), i) for i in range(8)] == \
        [bench.prompt_for(params(prompt_seed=seed, **workload), i) for i in range(8)]


def test_requests_spread_over_every_engine_with_each_ones_figures(inference_server, model_id):
    """One engine per NUMA node (layout per_node): request I to engine I mod N, each engine's share reported beside
    the aggregate. Two relays in front of the served engine stand for two engines; what each forwarded is counted
    on its own sockets, not by the module."""
    port = int(inference_server.rsplit(":", 1)[1])
    relays = [TimingRelay(port), TimingRelay(port)]
    urls = [f"http://127.0.0.1:{relay.port}" for relay in relays]
    try:
        result, failure, _ = bench.run(params(url=urls[0], more_urls=urls[1:], model=model_id, max_tokens=4, ignore_eos=True,
                                              warmup=1, requests=5, concurrency=[2]))
    finally:
        for relay in relays:
            relay.close()
    assert failure is None
    # Warm-up goes to each engine once; then requests 0, 2, 4 to the first, 1, 3 to the second.
    assert [len(relay.connections) for relay in relays] == [1 + 3, 1 + 2]
    level = result["levels"][0]
    assert [(e["url"], e["requests"], e["errors"]) for e in level["engines"]] == [(urls[0], 3, 0), (urls[1], 2, 0)]
    assert sum(e["output_tokens"] for e in level["engines"]) == level["output_tokens"] == 5 * 4
    assert all(e["ttft_ms_p50"] > 0 and e["decode_tokens_per_s_p50"] > 0 for e in level["engines"])


def test_several_engines_are_paired_with_their_own_twins(inference_server, model_id):
    """One engine per NUMA node beside their direct-run twins: request I of a level goes to engine I mod N on both
    sides, so each engine and its own twin answer the same prompts, and each side reports every engine's share.
    Four relays stand for two engines and two twins; what each forwarded is read from its own sockets."""
    port = int(inference_server.rsplit(":", 1)[1])
    relays = [TimingRelay(port) for _ in range(4)]
    engines, twins = ([f"http://127.0.0.1:{relay.port}" for relay in pair] for pair in (relays[:2], relays[2:]))
    try:
        result, failure, _ = bench.run(params(url=engines[0], more_urls=engines[1:], twin_url=twins[0],
                                              more_twin_urls=twins[1:], model=model_id, max_tokens=4,
                                              ignore_eos=True, warmup=1, requests=5, concurrency=[2]))
    finally:
        for relay in relays:
            relay.close()
    assert failure is None
    sent = [sorted(sent_prompt(r) for r in relay.connections) for relay in relays]
    prompts = [bench.prompt_for(params(prompt_seed=result["prompt_seed"]), i) for i in range(6)]
    # Warm-up (prompt 0) to every server; then request I (prompt I + 1) to engine I mod 2 and to its twin.
    assert sent[0] == sent[2] == sorted(prompts[i] for i in (0, 1, 3, 5))
    assert sent[1] == sent[3] == sorted(prompts[i] for i in (0, 2, 4))
    assert result["twin"]["urls"] == twins
    for level, urls in ((result["levels"][0], engines), (result["twin"]["levels"][0], twins)):
        assert [(e["url"], e["requests"], e["errors"]) for e in level["engines"]] == [(urls[0], 3, 0), (urls[1], 2, 0)]
        assert sum(e["output_tokens"] for e in level["engines"]) == level["output_tokens"] == 5 * 4
    # Rounds of 2, 2 and 1 requests: one gap each.
    assert result["twin"]["gap_percent"]["rounds"] == 3


@pytest.mark.parametrize("cached, evaluated, hit", [
    # llama-server on unique 128-token prompts: only Qwen3's chat-template opening (3 tokens) came from the cache.
    (3.0, 141.0, False),
    # The same prompt sent again (llama.cpp's log: "134 prefix-match hit, remaining 1 prompt tokens to eval").
    (134.0, 1.0, True),
    (None, None, False),  # an engine without counters
])
def test_cache_hit_counts_only_more_than_the_template_opening(cached, evaluated, hit):
    level = {"prompt_tokens_cached_mean": cached, "prompt_tokens_evaluated_mean": evaluated}
    assert bench.cache_hit(level) is hit


def test_the_engines_prefill_rate_sums_the_timed_prompts():
    """llama-server's timings of two requests (prompt_n, prompt_ms) and a request without them (a transformers
    server): the tokens over the milliseconds of the timed ones."""
    results = [{"prompt_evaluated": 139, "prompt_ms": 700.0}, {"prompt_evaluated": 1, "prompt_ms": 20.0},
               {"prompt_evaluated": None, "prompt_ms": None}]
    assert bench.engine_prefill_rate(results) == round(140 / 0.72, 3)
    assert bench.engine_prefill_rate(results[2:]) is None


def test_synthetic_prompts_start_with_different_words():
    firsts = [bench.synthetic_prompt(4, i).split()[0] for i in range(len(bench.SYNTHETIC_WORDS))]
    assert len(set(firsts)) == len(bench.SYNTHETIC_WORDS)


def test_an_engines_cpu_counts_its_child_processes():
    """vLLM's API server runs the model in a child (engine core) of a child (worker): a parent that waits while its
    grandchild spins shows the grandchild's CPU as its own, while it runs and after it is reaped."""
    from ansible.module_utils.llmtune_cpuload import process_cpu_s, process_tree

    spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
    child = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {spin!r}])\nsys.stdin.read()\n"
    run_child = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}], stdin=sys.stdin)\n"
    parent = subprocess.Popen([sys.executable, "-c", run_child], stdin=subprocess.PIPE)
    try:
        # Beside the emulated VM the spinner gets as little as a tenth of a CPU: a bound, not a wait.
        deadline = time.monotonic() + 60
        while len(process_tree(parent.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(process_tree(parent.pid)) == 3
        own = psutil.Process(parent.pid).cpu_times()
        # The grandchild ends once it has spun 0.6 s; its parent (the child) reaps it and waits on stdin.
        while len(process_tree(parent.pid)) > 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(process_tree(parent.pid)) == 2
        assert process_cpu_s(parent.pid) >= 0.6 > own.user + own.system
    finally:
        parent.communicate(b"", timeout=30)
    assert process_cpu_s(parent.pid) is None


def test_cpu_split_separates_engine_benchmark_and_others():
    before = {"wall": 100.0, "busy": 50.0, "steal": 0, "total": 10000, "engine": 20.0, "own": 1.0}
    after = {"wall": 110.0, "busy": 68.0, "steal": 100, "total": 12000, "engine": 32.0, "own": 2.0}
    split = bench.cpu_split(before, after)
    assert split == {"engine": 1.2, "benchmark": 0.1, "other": 0.5, "steal_percent": 5.0}
    assert bench.is_noisy(split, 0.25) and not bench.is_noisy(split, 0.5)
    assert bench.is_noisy(dict(split, other=0.0, steal_percent=5.1), 0.25)
    assert bench.cpu_split(dict(before, engine=None), after)["other"] == 1.7  # engine unknown: counted as other


def test_another_busy_process_marks_the_run_noisy(inference_server, model_id):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1)
        result, failure, warnings = bench.run(params(url=inference_server, model=model_id, requests=2,
                                                     engine_pid=engine_pid(inference_server)))
    finally:
        busy.kill()
        busy.wait()
    assert failure is None
    assert result["host_load"]["other_cpus_before"] >= 0.6
    level = result["levels"][0]
    assert level["cpu"]["other"] >= 0.5 and level["noisy"] and result["noisy"]
    assert level["cpu"]["engine"] > 0.05  # the engine's own work is not counted as noise
    assert any(w.startswith("concurrency 1: other processes used") for w in warnings)
    assert any(w.startswith("other processes kept") for w in warnings)


def ansible_adhoc(args, *extra):
    """Run the module through `ansible localhost -m inference_benchmark`; returns (rc, stdout)."""
    cmd = [os.path.join(VENV_BIN, "ansible"), "localhost", "-M", os.path.join(ROOT, "library"),
           "-m", "inference_benchmark", "-a", json.dumps(args), *extra]
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               ANSIBLE_NOCOLOR="true", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False)
    return done.returncode, done.stdout


def test_through_ansible(inference_server, model_id):
    rc, stdout = ansible_adhoc({"url": inference_server, "model": model_id, "requests": 2, "max_tokens": 8,
                                "warmup": 0, "api_key": "secret-key", "settle_timeout": 0})
    assert rc == 0, stdout
    assert stdout.startswith("localhost | SUCCESS => {")
    out = json.loads(stdout.split(" => ", 1)[1])
    assert out["changed"] is False
    assert out["summary"]["errors"] == 0 and out["summary"]["ttft_ms_p50"] > 0
    assert out["levels"][0]["output_tokens"] == 16
    assert "secret-key" not in stdout
    rc, stdout = ansible_adhoc({"url": inference_server, "requests": 2}, "--check")
    assert (rc, stdout.strip()) == (0, "localhost | SKIPPED")


def test_a_benchmark_waits_for_one_still_running(inference_server, model_id, tmp_path):
    """A benchmark left running by a killed ansible-playbook holds the lock: a rerun's measures start after it."""
    lock = tmp_path / "benchmark.lock"
    other = {}
    first = threading.Thread(target=lambda: other.update(zip(("rc", "stdout"), ansible_adhoc(
        {"url": inference_server, "model": model_id, "requests": 4, "max_tokens": 24, "warmup": 0,
         "settle_timeout": 0, "lock_path": str(lock)}))))
    first.start()
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.read_text().strip()):
        assert time.monotonic() < deadline, "the first benchmark never took the lock"
        time.sleep(0.05)
    holder = int(lock.read_text())
    result, failure, _ = bench.run(params(url=inference_server, model=model_id, requests=2, lock_path=str(lock)))
    first.join()
    assert other["rc"] == 0 and failure is None, other
    assert not psutil.pid_exists(holder) and result["host_load"]["lock_wait_s"] > 0
    assert lock.read_text() == f"{os.getpid()}\n"


def test_a_lock_held_too_long_fails_naming_its_holder(inference_server, model_id, tmp_path):
    lock = tmp_path / "benchmark.lock"
    with open(lock, "w", encoding="ascii") as held:
        held.write("4242\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        result, failure, _ = bench.run(params(url=inference_server, model=model_id, lock_path=str(lock),
                                              lock_timeout=1))
    assert failure == (f"another benchmark (PID 4242) still holds {lock} after 1 s: figures taken beside it "
                       "would not hold")
    assert "levels" not in result


def test_a_lock_that_is_a_symbolic_link_is_refused(inference_server, model_id, tmp_path):
    """Another user's link in the lock's place would make root write where it points."""
    (tmp_path / "lock").symlink_to(tmp_path / "elsewhere")
    result, failure, _ = bench.run(params(url=inference_server, model=model_id, lock_path=str(tmp_path / "lock")))
    link = tmp_path / "lock"
    assert failure == f"cannot open the benchmark lock {link}: [Errno 40] Too many levels of symbolic links: '{link}'"
    assert not (tmp_path / "elsewhere").exists() and "levels" not in result


# --- fixed-length synthetic prompt, ignore_eos, roofline ---

@pytest.mark.parametrize("tokens", [1, 100, 128, 333])
def test_synthetic_prompt_has_exactly_that_many_qwen_tokens(tiny_proxy_dir, tokens):
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(tiny_proxy_dir / "tokenizer.json"))
    # Every request's own order of the words, whichever word starts it.
    for index in list(range(len(bench.SYNTHETIC_WORDS))) + [500, 12345]:
        assert len(tokenizer.encode(bench.synthetic_prompt(tokens, index)).ids) == tokens, index


def test_synthetic_prompt_and_ignore_eos_reach_the_server(inference_server, model_id, tiny_proxy_dir):
    from transformers import AutoTokenizer
    prompt = bench.synthetic_prompt(64)
    # What the server tokenizes: the chat template around the synthetic prompt.
    templated = AutoTokenizer.from_pretrained(str(tiny_proxy_dir)).apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=True)
    result, failure, _ = bench.run(params(url=inference_server, model=model_id, prompts=None, prompt_tokens=64,
                                          ignore_eos=True, max_tokens=10, requests=2, decode_upper_bound=1e6))
    assert failure is None
    level = result["levels"][0]
    assert level["prompt_tokens_mean"] == len(templated["input_ids"])
    assert [s["output_tokens"] for s in level["samples"]] == [10, 10]
    assert (result["prompt_tokens"], result["ignore_eos"]) == (64, True)
    decode = result["summary"]["decode_tokens_per_s"]
    assert result["roofline"] == {"upper_bound_tokens_per_s": 1e6, "percent": round(100.0 * decode / 1e6, 1)}


def test_roofline_percent():
    assert bench.roofline(12.5, 50.0) == {"upper_bound_tokens_per_s": 50.0, "percent": 25.0}
    assert bench.roofline(None, 50.0) == {"upper_bound_tokens_per_s": 50.0, "percent": None}


@pytest.mark.parametrize("options, message", [
    ({"prompt_tokens": 8}, "prompts and prompt_tokens are mutually exclusive"),
    ({"prompts": None, "prompt_tokens": 0}, "prompt_tokens must be >= 1"),
    ({"decode_upper_bound": 0.0}, "decode_upper_bound must be > 0 tokens/s"),
])
def test_bad_synthetic_and_roofline_options(options, message):
    result, failure, _ = bench.run(params(model="m", **options))
    assert (failure, "levels" in result) == (message, False)


def test_paired_run_sends_each_round_to_both_in_swapped_order(inference_server, model_id):
    """A twin run: each request's prompt goes to the service and to its twin, the first swapped every round; the
    paired gaps are those of the module's own samples, round by round."""
    upstream = int(inference_server.rsplit(":", 1)[1])
    service, twin = TimingRelay(upstream), TimingRelay(upstream)
    try:
        result, failure, _ = bench.run(params(url=f"http://127.0.0.1:{service.port}", model=model_id, warmup=1,
                                              requests=4, max_tokens=8,
                                              twin_url=f"http://127.0.0.1:{twin.port}/v1",
                                              engine_pid=engine_pid(inference_server)))
    finally:
        service.close()
        twin.close()
    assert failure is None
    assert [sent_prompt(r) for r in service.connections] == [sent_prompt(r) for r in twin.connections] == \
        [bench.prompt_for(params(prompt_seed=result["prompt_seed"]), i) for i in range(5)]
    # Warm-up to the service first, then rounds 1-4: service first, twin first, service first, twin first.
    firsts = ["service" if s["accepted_at"] < t["accepted_at"] else "twin"
              for s, t in zip(service.connections, twin.connections)]
    assert firsts == ["service", "service", "twin", "service", "twin"]
    assert result["twin"]["url"] == f"http://127.0.0.1:{twin.port}/v1"
    mine, theirs = result["levels"][0]["samples"], result["twin"]["levels"][0]["samples"]
    assert len(mine) == len(theirs) == 4
    decode = [100 * (1 - m["decode_tokens_per_s"] / t["decode_tokens_per_s"]) for m, t in zip(mine, theirs)]
    e2e = [100 * (m["e2e_ms"] / t["e2e_ms"] - 1) for m, t in zip(mine, theirs)]
    gap = result["twin"]["gap_percent"]
    assert gap["rounds"] == 4
    # Samples are rounded to the microsecond: the recomputed gaps agree to 0.1 percentage point.
    assert gap["decode_tokens_per_s"]["median"] == pytest.approx(statistics.median(decode), abs=0.1)
    assert gap["decode_tokens_per_s"]["min"] == pytest.approx(min(decode), abs=0.1)
    assert gap["e2e_ms"]["max"] == pytest.approx(max(e2e), abs=0.1)
    assert result["twin"]["summary"]["decode_tokens_per_s"] == result["twin"]["levels"][0]["decode_tokens_per_s"]["p50"]
    # Both engines are one process here; its CPU time is the engine's, not noise.
    assert result["levels"][0]["cpu"]["engine"] > 0.05


@pytest.mark.parametrize("delay_s, limit, deadline, rounds, verdicts", [
    # Each SSE event of the service held 40 ms: far slower, rounds added up to twin_max_rounds. "over" when
    # every round shows it; beside the compile and the VM one round of the twin was once slower still
    # ("unresolved"): what the verdict makes of the rounds is tested on fixed figures below.
    (0.04, 5.0, 0, 5, {"over", "unresolved"}),
    # Within the limit after the planned rounds: none added.
    (0.0, 1000.0, 0, 2, {"within"}),
    # The same gap past the row's deadline (its share of the auto-tune's budget): the planned rounds alone.
    (0.04, 5.0, 1.0, 2, {"over", "unresolved", "within"}),
])
def test_rounds_are_added_while_the_gap_is_not_within(inference_server, model_id, delay_s, limit, deadline, rounds,
                                                      verdicts):
    upstream = int(inference_server.rsplit(":", 1)[1])
    service, twin = TimingRelay(upstream, delay_s), TimingRelay(upstream)
    try:
        result, failure, _ = bench.run(params(url=f"http://127.0.0.1:{service.port}", model=model_id, warmup=1,
                                              requests=2, max_tokens=6, concurrency=[1, 2],
                                              twin_url=f"http://127.0.0.1:{twin.port}", twin_max_rounds=5,
                                              twin_max_gap_percent=limit, twin_deadline=deadline))
    finally:
        service.close()
        twin.close()
    assert failure is None
    gap = result["twin"]["gap_percent"]
    assert (gap["rounds"], gap["planned_rounds"]) == (rounds, 2) and gap["verdict"] in verdicts, gap
    # Every added round sent new prompts, and the next level went on after them: no prompt was sent twice.
    sent = sorted(sent_prompt(r) for r in service.connections)
    assert sent == sorted(sent_prompt(r) for r in twin.connections)
    assert len(set(sent)) == len(sent) == 1 + rounds + result["twin"]["levels"][1]["gap_percent"]["rounds"] * 2


def test_round_gaps_and_their_spread():
    service = [{"decode_tokens_per_s": 18.0, "ttft_ms": 110.0, "e2e_ms": 1100.0},
               {"decode_tokens_per_s": 22.0, "ttft_ms": 90.0, "e2e_ms": 1000.0}]
    twin = [{"decode_tokens_per_s": 25.0, "ttft_ms": 100.0, "e2e_ms": 1000.0}, {"error": "HTTP 500"}]
    gap = bench.round_gap(service, twin)
    assert gap == {"decode_tokens_per_s": pytest.approx(20.0), "ttft_ms": pytest.approx(0.0),
                   "e2e_ms": pytest.approx(5.0)}
    assert bench.round_gap(service, [{"error": "timeout"}]) == {"decode_tokens_per_s": None, "ttft_ms": None,
                                                                "e2e_ms": None}
    spread = bench.gap_spread([gap, {"decode_tokens_per_s": -4.0, "ttft_ms": None, "e2e_ms": -2.0},
                               {"decode_tokens_per_s": 2.04, "ttft_ms": 3.0, "e2e_ms": 1.0},
                               {"decode_tokens_per_s": None, "ttft_ms": None, "e2e_ms": None}], 5.0)
    assert spread == {"rounds": 3, "decode_tokens_per_s": {"median": 2.0, "min": -4.0, "max": 20.0},
                      "ttft_ms": {"median": 1.5, "min": 0.0, "max": 3.0},
                      "e2e_ms": {"median": 1.0, "min": -2.0, "max": 5.0}, "verdict": "within"}


# Rounds of the demo's sweep on a 2-vCPU Zen 5 VM: a row over 5 % from two rounds that disagree is noise (the same
# unit measured 12 rounds at a time gave -1.2 to +3.3 % with and without its syscall filter).
@pytest.mark.parametrize("decode, e2e, limit, verdict", [
    ([-1.0, 17.4], [2.0, 3.0], 5.0, "unresolved"),
    ([6.1, 10.3], [2.0, 3.0], 5.0, "over"),
    ([1.0, 2.0, 2.0], [5.5, 7.0, -0.5], 5.0, "unresolved"),
    ([1.0, 2.0, 2.0], [5.5, 7.0, 0.5], 5.0, "over"),
    ([6.1, 10.3], [2.0, 3.0], 10.0, "within"),
    ([4.9, 5.0], [-3.0, 5.0], 5.0, "within"),
])
def test_a_gap_beyond_the_limit_counts_only_when_every_round_agrees(decode, e2e, limit, verdict):
    gaps = [{"decode_tokens_per_s": d, "ttft_ms": None, "e2e_ms": e} for d, e in zip(decode, e2e)]
    assert bench.gap_spread(gaps, limit)["verdict"] == verdict


@pytest.mark.parametrize("options, message", [
    ({"twin_url": "http://127.0.0.1:8000/"}, "every twin must be a server of its own, none of url and more_urls"),
    ({"twin_engine_pid": -1}, "engine_pid, twin_engine_pid, busy_limit, settle_timeout and lock_timeout must be >= 0"),
    ({"twin_max_gap_percent": -0.5}, "twin_max_gap_percent must be >= 0"),
    ({"twin_max_rounds": -1}, "twin_max_rounds must be >= 0"),
])
def test_bad_twin_options(options, message):
    assert bench.run(params(model="m", **options))[1] == message


def test_a_twin_that_answers_nothing_fails_the_run(inference_server, model_id):
    twin_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result, failure, _ = bench.run(params(url=inference_server, model=model_id, requests=2, max_tokens=4,
                                          twin_url=twin_url))
    assert result["levels"][0]["errors"] == 0
    assert result["twin"]["gap_percent"]["rounds"] == 0
    assert failure == (f"all 2 requests at concurrency 1 to {twin_url} failed: "
                       "ConnectionRefusedError: [Errno 111] Connection refused")


@pytest.mark.parametrize("workload", [{"prompts": PROMPTS}, {"prompts": None, "prompt_tokens": 24}])
def test_no_prompt_of_a_run_was_sent_by_an_earlier_run(inference_server, model_id, workload):
    """A server keeps its prompt cache between runs: a llama.cpp server that had run the same prompt sequence
    before reused 18 of 19 prompt tokens of each request (TTFT 51-69 ms against 180 ms on a fresh one). Two runs
    against the same server share no prompt beyond two words (with a two-word tag, 'community hour. Why is the sky
    blue?' and 'community hour. (2) What is the capital of Australia?' shared the whole tag)."""
    runs = []
    for _ in range(2):
        relay = TimingRelay(int(inference_server.rsplit(":", 1)[1]))
        try:
            result, failure, _ = bench.run(params(url=f"http://127.0.0.1:{relay.port}", model=model_id, max_tokens=2,
                                                  warmup=1, requests=3, **workload))
        finally:
            relay.close()
        assert failure is None
        runs.append((result["prompt_seed"], [sent_prompt(record) for record in relay.connections]))
    (seed1, first), (seed2, second) = runs
    assert seed1 != seed2 and len(first) == len(second) == 4
    for old in first:
        for new in second:
            assert len(os.path.commonprefix([old.split(), new.split()])) <= 2, (old, new)
    if workload.get("prompt_tokens"):
        # Still exactly that many words, each one Qwen token.
        assert {len(prompt.split()) for prompt in first + second} == {24}


def test_the_tag_of_a_request_comes_from_the_seed_and_its_index():
    assert bench.prompt_for(params(prompt_seed=0), 1) == PROMPTS[1]
    count = len(bench.SYNTHETIC_WORDS)
    tags = [bench.prompt_for(params(prompt_seed=1), i).split(".")[0] for i in range(count)]
    # Word 1 + index first: distinct within a run; the same seed and index give the same tag.
    assert [tag.split()[0] for tag in tags] == [bench.SYNTHETIC_WORDS[(1 + i) % count] for i in range(count)]
    assert tags == [bench.prompt_for(params(prompt_seed=1), i).split(".")[0] for i in range(count)]
    assert bench.prompt_for(params(prompt_seed=1 + count), 0) != bench.prompt_for(params(prompt_seed=1), 0)
