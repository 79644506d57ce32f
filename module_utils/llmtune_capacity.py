# -*- coding: utf-8 -*-
"""Capacity of a service at its operator's service-level targets.

The one place of: the concurrency levels a capacity sweep runs and why it stops, whether a request and a level meet
the targets, goodput and the capacity. library/inference_benchmark.py runs the sweep.

Targets are a dict {"ttft_p95_ms": float, "itl_p95_ms": float}. A level is a level of inference_benchmark (its
RV(levels[]) entry: concurrency, requests, errors, wall_s, ttft_ms, itl_ms, samples (each with ttft_ms, itl_ms_p95
and output_tokens), output_tokens, output_tokens_per_s, requests_per_s, noisy).
"""

from __future__ import annotations


def level_requests(concurrency, min_requests):
    """Requests of a sweep level: every stream sends at least two, and at least MIN_REQUESTS for a p95 of TTFT (an
    interpolated p95 of fewer than 20 requests is mostly their maximum)."""
    return max(2 * concurrency, min_requests)


def request_within(sample, targets):
    """True when one request met both targets: its TTFT at most the TTFT target and the p95 of its own inter-token
    gaps at most the ITL target (a request of one token has no gap to break it)."""
    itl = sample.get("itl_ms_p95")
    return sample["ttft_ms"] <= targets["ttft_p95_ms"] and (itl is None or itl <= targets["itl_p95_ms"])


def judge_level(level, targets):
    """What a level gives against TARGETS: goodput_tokens_per_s (output tokens of the requests within both targets
    per second of the level), requests_within_targets, broken (why the level misses: a target above its p95 or
    failed requests; empty when it meets both) and meets_targets. A level's samples are its successful requests,
    whose output tokens make its output_tokens."""
    good = [sample for sample in level["samples"] if request_within(sample, targets)]
    tokens = level["output_tokens"]
    broken = []
    if level["errors"]:
        broken.append(f"{level['errors']} of {level['requests']} requests failed")
    ttft, itl = level["ttft_ms"]["p95"], level["itl_ms"]["p95"]
    if ttft is None or ttft > targets["ttft_p95_ms"]:
        broken.append(f"TTFT p95 {ttft} ms > {targets['ttft_p95_ms']:g} ms")
    if itl is not None and itl > targets["itl_p95_ms"]:
        broken.append(f"ITL p95 {itl} ms > {targets['itl_p95_ms']:g} ms")
    # The level's aggregate rate, in the share of its output tokens that came from requests within both targets.
    share = sum(sample["output_tokens"] for sample in good) / tokens if tokens else 0.0
    return {"goodput_tokens_per_s": round(level["output_tokens_per_s"] * share, 3),
            "requests_within_targets": len(good), "broken": broken, "meets_targets": not broken}


def streams(count):
    """COUNT streams, in words."""
    return f"{count} stream{'' if count == 1 else 's'}"


def next_level(levels, max_concurrency, min_requests, elapsed_s, time_limit_s):
    """(concurrency of the next level or None, True when it measures the last level again, why the sweep stops).

    The sweep doubles the streams until a level breaks a target or has failed requests (that level is the last).
    A level that missed a latency target while other processes took CPU time (noisy) is measured once more, time
    permitting, before the sweep stops on it. No level starts that would end after TIME_LIMIT_S, estimated from the
    last level's requests/s (the next level has more streams, so rarely fewer requests per second).
    """
    if not levels:
        return 1, False, None
    last = levels[-1]
    again = bool(last["broken"] and last["noisy"] and not last.get("errors") and not last.get("remeasured"))
    concurrency = last["concurrency"] if again else 2 * last["concurrency"]
    left = time_limit_s - elapsed_s
    estimate = level_requests(concurrency, min_requests) / last["requests_per_s"] if last["requests_per_s"] else None
    in_time = estimate is not None and estimate <= left
    if last["broken"] and not (again and in_time):
        return None, False, f"{'; '.join(last['broken'])} at {streams(last['concurrency'])}"
    if concurrency > max_concurrency:
        return None, False, f"every level up to {streams(max_concurrency)} (capacity_max_concurrency) met the targets"
    if not in_time:
        about = f"about {estimate:.0f} s" if estimate is not None else "an unknown time"
        return None, False, (f"time limit: {streams(concurrency)} would take {about}, {max(left, 0):.0f} s of "
                             f"{time_limit_s:g} s left")
    return concurrency, again, None


def capacity_of(levels, targets, stopped, elapsed_s):
    """The sweep's answer: the highest concurrency whose level met both targets (0 when the first did not), its
    goodput and aggregate output tokens/s, the targets and why the sweep stopped."""
    met = [level for level in levels if level["meets_targets"]]
    best = max(met, key=lambda level: level["concurrency"]) if met else None
    return {"targets": dict(targets), "concurrency": best["concurrency"] if best else 0,
            "goodput_tokens_per_s": best["goodput_tokens_per_s"] if best else 0.0,
            "output_tokens_per_s": best["output_tokens_per_s"] if best else 0.0,
            "levels": [level["concurrency"] for level in levels], "stopped": stopped, "elapsed_s": round(elapsed_s, 1)}
