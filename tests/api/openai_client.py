#!/usr/bin/env python3
"""Talk to the deployed service with the official ``openai`` client, as LangChain's ChatOpenAI does.

Run on the node with the service venv's Python (``openai`` is a dependency of ``transformers[serving]``)::

    /opt/llmtune/venv/bin/python openai_client.py --base-url http://127.0.0.1:8000/v1 --model /opt/llmtune/models/m

Checks a non-streamed and a streamed chat completion (real text, real token counts, a finish reason); behind the
proxy, ``--expect-auth`` checks that a wrong API key raises ``openai.AuthenticationError`` (401) and
``--expect-limit N`` that N + 2 simultaneous requests get at least two ``openai.RateLimitError`` (429).
``--concurrent N`` streams N requests at once (unique prompts, EOS ignored) while polling the engine's health and
model list: every stream must end whole, none cut by another request or by a poll.
Prints one JSON line with what was observed; exits 1 with a one-line reason on the first failed check.
"""

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import urllib.error
import urllib.request

import openai


def check(condition: bool, message: str) -> None:
    """Stop with a one-line reason when a check fails."""
    if not condition:
        sys.exit(f"FAIL: {message}")


def non_streamed(client: openai.OpenAI, model: str, max_tokens: int) -> dict:
    """One chat completion in one JSON answer; returns its text and usage."""
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is a CPU cache?"}],
        max_tokens=max_tokens,
    )
    choice = answer.choices[0]
    check(bool(choice.message.content), f"empty content: {answer!r}")
    check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    check(answer.usage is not None, "no usage in the answer")
    check(answer.usage.prompt_tokens > 0, f"prompt_tokens {answer.usage.prompt_tokens}")
    check(0 < answer.usage.completion_tokens <= max_tokens, f"completion_tokens {answer.usage.completion_tokens}")
    check(answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens, "total_tokens")
    return {"content": choice.message.content, "usage": answer.usage.model_dump(), "finish_reason": choice.finish_reason}


def streamed(client: openai.OpenAI, model: str, max_tokens: int) -> dict:
    """One chat completion as server-sent events; returns the joined text, chunk count and usage.

    Every engine sends token counts in a last event when asked (``stream_options.include_usage``).
    """
    pieces, finish_reason, chunks, usage, first_token_at = [], None, 0, None, None
    start = time.monotonic()
    with client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name three CPU registers."}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    ) as stream:
        for chunk in stream:
            chunks += 1
            usage = chunk.usage or usage
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                if choice.delta.content and first_token_at is None:
                    first_token_at = time.monotonic() - start
                finish_reason = choice.finish_reason or finish_reason
    total = time.monotonic() - start
    content = "".join(pieces)
    # Tokens arrive one by one, so a multi-token answer comes in several chunks.
    check(sum(1 for p in pieces if p) > 1, f"{chunks} chunks, content pieces {pieces!r}")
    check(bool(content), "empty streamed content")
    check(finish_reason in ("stop", "length"), f"stream finish_reason {finish_reason!r}")
    # Unbuffered SSE: the first token arrives well before the last (a buffering proxy delivers all at the end).
    check(first_token_at is not None and first_token_at < 0.8 * total, f"TTFT {first_token_at}s of {total:.2f}s")
    check(usage is not None and 0 < usage.completion_tokens <= max_tokens, f"stream usage {usage!r}")
    return {
        "content": content,
        "chunks": chunks,
        "finish_reason": finish_reason,
        "usage": usage.model_dump() if usage else None,
        "ttft_s": round(first_token_at, 3),
        "total_s": round(total, 3),
    }


def wrong_key_refused(base_url: str, model: str) -> str:
    """A wrong bearer token must raise AuthenticationError (401); returns the error code."""
    client = openai.OpenAI(base_url=base_url, api_key="wrong-key-0123456789", max_retries=0)
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    except openai.AuthenticationError as error:
        return str(error.code)
    sys.exit("FAIL: a wrong API key was accepted")


def over_the_limit(client: openai.OpenAI, model: str, limit: int) -> dict:
    """limit + 2 requests at once: the proxy must answer the extra ones 429 (RateLimitError), the rest 200."""

    def one(_: int) -> str:
        try:
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Count to twenty."}], max_tokens=32
            )
        except openai.RateLimitError:
            return "429"
        return "200"

    with ThreadPoolExecutor(max_workers=limit + 2) as pool:
        statuses = list(pool.map(one, range(limit + 2)))
    counts = {status: statuses.count(status) for status in set(statuses)}
    check(counts.get("429", 0) >= 2 and counts.get("200", 0) >= 1, f"statuses {counts} for {limit + 2} requests")
    return counts


def concurrent_streams(client: openai.OpenAI, model: str, engine: str, n: int, max_tokens: int) -> dict:
    """N streamed chat completions at once while /health and /v1/models are polled every 0.2 s.

    Each must generate exactly MAX_TOKENS tokens (its usage; EOS ignored) and finish with ``length``; every poll
    must answer 200. Returns per-stream seconds and the poll counts.
    """
    # EOS ignored so that every stream has the same length: llama-server's and vLLM's ignore_eos field, transformers
    # serve's generation_config (both outside the OpenAI API, sent through extra_body).
    extra = ({"ignore_eos": True} if engine in ("llama_cpp", "vllm") else
             {"generation_config": json.dumps({"min_new_tokens": max_tokens, "max_new_tokens": max_tokens})})
    root = str(client.base_url).rstrip("/").removesuffix("/v1")
    done = False
    polls = {"200": 0, "other": []}

    def get(path: str) -> int:
        request = urllib.request.Request(root + path, headers={"Authorization": f"Bearer {client.api_key}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code

    def poll() -> None:
        while not done:
            for path in ("/health", "/v1/models"):
                status = get(path)
                if status == 200:
                    polls["200"] += 1
                else:
                    polls["other"].append(f"{path} {status}")
            time.sleep(0.2)

    def one(i: int) -> dict:
        tokens, finish_reason, start = None, None, time.monotonic()
        prompt = f"Request {i} of {n} at {time.time_ns()}: explain why CPUs have several cache levels."
        with client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                            max_tokens=max_tokens, stream=True, extra_body=extra,
                                            stream_options={"include_usage": True}) as stream:
            for chunk in stream:
                tokens = chunk.usage.completion_tokens if chunk.usage else tokens
                for choice in chunk.choices:
                    finish_reason = choice.finish_reason or finish_reason
        return {"tokens": tokens, "finish_reason": finish_reason, "seconds": round(time.monotonic() - start, 2)}

    with ThreadPoolExecutor(max_workers=n + 1) as pool:
        poller = pool.submit(poll)
        streams = list(pool.map(one, range(n)))
        done = True
        poller.result()
    for i, stream in enumerate(streams):
        check(stream["finish_reason"] == "length" and stream["tokens"] == max_tokens,
              f"stream {i} of {n} cut short: {stream}")
    check(polls["200"] > 0 and not polls["other"], f"polls during the streams: {polls}")
    return {"streams": streams, "polls_ok": polls["200"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="API root, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True, help="model name the service serves")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", "none"),
        help="bearer token (default: $OPENAI_API_KEY; any value when the engine is direct)",
    )
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens to generate per request")
    parser.add_argument("--engine", choices=("transformers", "llama_cpp", "vllm"), default="transformers",
                        help="engine behind the API (how --concurrent asks it to ignore end-of-sequence)")
    parser.add_argument("--expect-auth", action="store_true", help="also check that a wrong key gets 401")
    parser.add_argument("--expect-limit", type=int, default=0, help="requests in flight the proxy allows (0: skip)")
    parser.add_argument("--concurrent", type=int, default=0,
                        help="streams at once while health is polled (0: skip)")
    args = parser.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, timeout=300, max_retries=0)
    result = {
        "openai_version": openai.__version__,
        "non_streamed": non_streamed(client, args.model, args.max_tokens),
        "streamed": streamed(client, args.model, args.max_tokens),
    }
    if args.expect_auth:
        result["wrong_key_error"] = wrong_key_refused(args.base_url, args.model)
    if args.expect_limit:
        result["over_the_limit"] = over_the_limit(client, args.model, args.expect_limit)
    if args.concurrent:
        result["concurrent"] = concurrent_streams(client, args.model, args.engine, args.concurrent, 4 * args.max_tokens)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
