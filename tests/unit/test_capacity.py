"""Capacity at the operator's targets (issue 37, item 1): the sweep of library/inference_benchmark.py against the real
`transformers serve` of the tiny proxy, and module_utils/llmtune_capacity.py's verdicts on recorded levels."""

import socket
import time

import pytest

import transformers  # noqa: F401  (the real engine serves the tests)

import inference_benchmark as bench  # noqa: E402  (library/ is on sys.path via conftest)
from ansible.module_utils import llmtune_capacity as cap  # noqa: E402
from conftest import FIXTURES, free_port  # noqa: E402
from test_inference_benchmark import TimingRelay, params, sent_prompt  # noqa: E402

TARGETS = {"ttft_p95_ms": 2000.0, "itl_p95_ms": 100.0}


def sweep(url, **overrides):
    """Options of a capacity sweep of short requests (the tiny proxy answers in milliseconds)."""
    values = dict(url=url, capacity=True, target_ttft_p95_ms=60000.0, target_itl_p95_ms=60000.0,
                  capacity_min_requests=4, capacity_max_concurrency=4, max_tokens=6, ignore_eos=True, warmup=1)
    values.update(overrides)
    return params(**values)


@pytest.fixture(scope="module")
def model_id(inference_server, tiny_proxy_dir):
    return str(tiny_proxy_dir)


class ReceivingRelay(TimingRelay):
    """A TimingRelay that also notes when each response piece came from the server, before forwarding it: the
    client cannot have it, nor have started its next request, before that."""

    def _responses(self, upstream, client, record):
        record["received"] = []
        while True:
            data = upstream.recv(65536)
            if not data:
                break
            record["received"].append((time.time(), data))
            client.sendall(data)
        client.shutdown(socket.SHUT_WR)


def overlap(records):
    """The most requests open at once, each from its arrival at the relay to the last piece of its response from the
    server (`transformers serve` ends the stream without [DONE]: the client reads to the end of the chunked body),
    both inside the time the client had it open."""
    done = [r["received"][-1][0] for r in records]
    events = sorted([(r["accepted_at"], 1) for r in records] + [(end, -1) for end in done],
                    key=lambda event: (event[0], event[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_a_sweep_doubles_the_streams_in_a_closed_loop_of_unique_prompts(inference_server, model_id):
    """Targets nothing breaks: levels 1, 2 and 4 streams, each of max(2 x streams, 4) requests with at most that many
    in flight, every prompt of the run its own, and the capacity the last level."""
    relay = ReceivingRelay(int(inference_server.rsplit(":", 1)[1]))
    try:
        result, failure, _ = bench.run(sweep(f"http://127.0.0.1:{relay.port}", model=model_id))
    finally:
        relay.close()
    assert failure is None
    levels = result["levels"]
    assert [(level["concurrency"], level["requests"], level["errors"]) for level in levels] == \
        [(1, 4, 0), (2, 4, 0), (4, 8, 0)]
    # The warm-up request, then the levels' requests in order: a closed loop of each level's streams.
    records = relay.connections[1:]
    assert len(records) == 16
    assert overlap(records[:4]) == 1 and overlap(records[4:8]) <= 2 and 2 < overlap(records[8:]) <= 4
    sent = [sent_prompt(r) for r in relay.connections]
    assert len(set(sent)) == len(sent) == 17
    for level in levels:
        assert level["meets_targets"] and level["broken"] == []
        assert level["requests_within_targets"] == level["requests"]
        assert level["goodput_tokens_per_s"] == pytest.approx(level["output_tokens_per_s"], rel=1e-3)
        assert all(s["itl_ms_p95"] > 0 and s["output_tokens"] == 6 for s in level["samples"])
    capacity = result["capacity"]
    assert capacity == {"targets": {"ttft_p95_ms": 60000.0, "itl_p95_ms": 60000.0}, "concurrency": 4,
                        "goodput_tokens_per_s": levels[2]["goodput_tokens_per_s"],
                        "output_tokens_per_s": levels[2]["output_tokens_per_s"], "levels": [1, 2, 4],
                        "stopped": "every level up to 4 streams (capacity_max_concurrency) met the targets",
                        "elapsed_s": capacity["elapsed_s"]}
    assert result["summary"]["concurrency"] == 1


def test_a_target_one_stream_cannot_meet_stops_the_sweep_at_once(inference_server, model_id):
    """An ITL target below any real gap: the first level misses it, the capacity is 0 and the report says why."""
    result, failure, _ = bench.run(sweep(inference_server, model=model_id, target_itl_p95_ms=0.001))
    assert failure is None
    (level,) = result["levels"]
    assert (level["concurrency"], level["meets_targets"], level["goodput_tokens_per_s"]) == (1, False, 0.0)
    assert level["broken"] == [f"ITL p95 {level['itl_ms']['p95']} ms > 0.001 ms"]
    assert result["capacity"]["concurrency"] == 0
    assert result["capacity"]["stopped"] == f"ITL p95 {level['itl_ms']['p95']} ms > 0.001 ms at 1 stream"


def test_the_time_limit_starts_no_level_that_would_end_after_it(inference_server, model_id):
    result, failure, _ = bench.run(sweep(inference_server, model=model_id, capacity_time_limit=0.01))
    assert failure is None
    assert [level["concurrency"] for level in result["levels"]] == [1]
    assert result["capacity"]["concurrency"] == 1
    assert result["capacity"]["stopped"].startswith("time limit: 2 streams would take about ")
    assert result["capacity"]["stopped"].endswith(" s of 0.01 s left")


def test_an_unreachable_service_fails_the_first_level():
    url = f"http://127.0.0.1:{free_port()}"
    result, failure, _ = bench.run(sweep(url, model="m", warmup=0))
    assert failure == (f"all 4 requests at concurrency 1 to {url} failed: "
                       "ConnectionRefusedError: [Errno 111] Connection refused")
    assert result["capacity"]["concurrency"] == 0
    assert result["capacity"]["stopped"] == "4 of 4 requests failed; TTFT p95 None ms > 60000 ms at 1 stream"


@pytest.mark.parametrize("options, message", [
    ({"twin_url": "http://127.0.0.1:8100"},
     "capacity and twin_url are mutually exclusive: the sweep's closed loop has no paired rounds"),
    ({"target_itl_p95_ms": None}, "capacity needs target_ttft_p95_ms and target_itl_p95_ms"),
    ({"target_ttft_p95_ms": 0.0}, "target_ttft_p95_ms and target_itl_p95_ms must be > 0 ms"),
    ({"capacity_min_requests": 0}, "capacity_max_concurrency and capacity_min_requests must be >= 1"),
    ({"capacity_time_limit": 0.0}, "capacity_time_limit must be > 0 s"),
])
def test_bad_capacity_options_fail_before_any_request(options, message):
    result, failure, _ = bench.run(sweep("http://127.0.0.1:1", model="m", **options))
    assert (failure, "levels" in result) == (message, False)


# --- the verdicts on recorded levels ---

def level(concurrency, ttft_p95, itl_p95, samples, errors=0, wall_s=10.0, noisy=False, requests_per_s=1.0):
    """A level as inference_benchmark reports it, with the figures the verdicts read."""
    return {"concurrency": concurrency, "requests": len(samples) + errors, "errors": errors, "wall_s": wall_s,
            "ttft_ms": {"p50": ttft_p95 / 2, "p95": ttft_p95}, "itl_ms": {"p50": itl_p95 / 2, "p95": itl_p95},
            "samples": samples, "noisy": noisy, "requests_per_s": requests_per_s,
            "output_tokens": sum(s["output_tokens"] for s in samples),
            "output_tokens_per_s": sum(s["output_tokens"] for s in samples) / wall_s}


def sample(ttft_ms, itl_ms_p95, output_tokens=32):
    return {"ttft_ms": ttft_ms, "itl_ms_p95": itl_ms_p95, "output_tokens": output_tokens}


def test_goodput_counts_the_output_tokens_of_requests_within_both_targets():
    samples = [sample(500, 80), sample(2100, 60), sample(900, 120), sample(1999.9, 100.0), sample(300, None, 1)]
    verdict = cap.judge_level(level(4, 1900.0, 95.0, samples, wall_s=8.0), TARGETS)
    # Within: the first, the fourth (at the targets) and the one-token request (no gap to break).
    assert verdict == {"goodput_tokens_per_s": round((32 + 32 + 1) / 8.0, 3), "requests_within_targets": 3,
                       "broken": [], "meets_targets": True}


@pytest.mark.parametrize("ttft, itl, errors, broken", [
    (2000.0, 100.0, 0, []),
    (2000.1, 100.0, 0, ["TTFT p95 2000.1 ms > 2000 ms"]),
    (1500.0, 100.5, 0, ["ITL p95 100.5 ms > 100 ms"]),
    (2500.0, 130.0, 1, ["1 of 3 requests failed", "TTFT p95 2500.0 ms > 2000 ms", "ITL p95 130.0 ms > 100 ms"]),
])
def test_a_level_breaks_on_either_p95_or_a_failed_request(ttft, itl, errors, broken):
    verdict = cap.judge_level(level(2, ttft, itl, [sample(100, 50), sample(100, 50)], errors=errors), TARGETS)
    assert (verdict["broken"], verdict["meets_targets"]) == (broken, not broken)


def judged(concurrency, broken=(), noisy=False, remeasured=False, requests_per_s=2.0):
    return {"concurrency": concurrency, "broken": list(broken), "noisy": noisy, "remeasured": remeasured,
            "requests_per_s": requests_per_s, "meets_targets": not broken, "goodput_tokens_per_s": 10.0 * concurrency,
            "output_tokens_per_s": 11.0 * concurrency}


@pytest.mark.parametrize("levels, elapsed, step", [
    ([], 0, (1, False, None)),
    ([judged(1), judged(2)], 10, (4, False, None)),
    # A break ends the sweep on that level.
    ([judged(1), judged(2, ["TTFT p95 2300.0 ms > 2000 ms"])], 10,
     (None, False, "TTFT p95 2300.0 ms > 2000 ms at 2 streams")),
    # A break while other processes took CPU time: that level once more, then the sweep ends on it.
    ([judged(1), judged(2, ["ITL p95 140.0 ms > 100 ms"], noisy=True)], 10, (2, True, None)),
    # Not without the time for it, nor for failed requests.
    ([judged(1), judged(2, ["ITL p95 140.0 ms > 100 ms"], noisy=True)], 295,
     (None, False, "ITL p95 140.0 ms > 100 ms at 2 streams")),
    ([judged(1), dict(judged(2, ["1 of 20 requests failed"], noisy=True), errors=1)], 10,
     (None, False, "1 of 20 requests failed at 2 streams")),
    ([judged(1), judged(2, ["ITL p95 140.0 ms > 100 ms"], noisy=True, remeasured=True)], 10,
     (None, False, "ITL p95 140.0 ms > 100 ms at 2 streams")),
    ([judged(1), judged(2), judged(4), judged(8)], 10,
     (None, False, "every level up to 8 streams (capacity_max_concurrency) met the targets")),
    # 16 streams: 32 requests at the last level's 2 requests/s, 16 s, with 15 s left.
    ([judged(1), judged(2), judged(4), judged(8)], 285, "max 16"),
])
def test_each_step_of_the_sweep(levels, elapsed, step):
    if step == "max 16":
        assert cap.next_level(levels, 16, 20, elapsed, 300) == \
            (None, False, "time limit: 16 streams would take about 16 s, 15 s of 300 s left")
        assert cap.next_level(levels, 16, 20, elapsed - 2, 300) == (16, False, None)
    else:
        assert cap.next_level(levels, 8, 20, elapsed, 300) == step


def test_a_level_has_two_requests_a_stream_and_enough_for_a_p95():
    assert [cap.level_requests(c, 20) for c in (1, 8, 16, 32)] == [20, 20, 32, 64]


def test_the_capacity_is_the_last_level_that_met_both_targets():
    levels = [judged(1), judged(2), judged(4, ["TTFT p95 2300.0 ms > 2000 ms"])]
    assert cap.capacity_of(levels, TARGETS, "TTFT p95 2300.0 ms > 2000 ms at 4 streams", 61.27) == {
        "targets": TARGETS, "concurrency": 2, "goodput_tokens_per_s": 20.0, "output_tokens_per_s": 22.0,
        "levels": [1, 2, 4], "stopped": "TTFT p95 2300.0 ms > 2000 ms at 4 streams", "elapsed_s": 61.3}
    assert cap.capacity_of([judged(1, ["ITL p95 140.0 ms > 100 ms"])], TARGETS, "x", 5)["concurrency"] == 0
