"""library/inference_benchmark.py against guidellm, a well-kept benchmarking tool of the field, on one real service.

Both send the same prompts (requests 1 to 4 of the module's own sequence) for the same output length to the same
`transformers serve`, one request at a time; their TTFT and time per output token must agree within 10 %.
This VM's speed drifts by 10-15 % within a minute (one tool's TPOT p50 86 then 100 ms in two runs; in CI, one run
of each tool measured TTFT 129 then 102 ms), which one run of each tool cannot tell from a disagreement. So each
guidellm run is bracketed by two runs of ours (ours, guidellm, ours, guidellm, ...), compared with the mean of
those two, and the mean of these ratios must be within 10 % of 1.
llama-benchy 0.4.0 cannot be used here: it always sends `return_token_ids`, which transformers serve refuses (422);
guidellm sends only OpenAI fields when it is given prompts and a max_tokens (its synthetic data adds `ignore_eos`).
Marked `crosscheck`: the test command runs it alone, after the linters, so that both tools see a quiet machine.
"""

import json
import os
import subprocess

import pytest

import inference_benchmark as bench  # noqa: E402  (library/ is on sys.path via conftest)
from conftest import PROXY_ENV, VENV_BIN, serve  # noqa: E402

pytestmark = pytest.mark.crosscheck
PROMPT_TOKENS, OUTPUT_TOKENS, REQUESTS = 128, 32, 4
GUIDELLM_RUNS = 3


@pytest.fixture(scope="module")
def proxy_server(proxy_model_dir, tmp_path_factory):
    # One engine thread on the first CPU, the clients (this process and guidellm's, which inherit its mask) on the
    # others: unpinned, the scheduler put a client on the engine's CPU now and then and the same tool's TPOT p50
    # moved 86 -> 100 ms between two runs minutes apart.
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, "the cross-check needs two CPUs: one for the engine, one for the clients"
    with serve(proxy_model_dir, tmp_path_factory.mktemp("serve-2l"), threads=1, cpus={cpus[0]}) as url:
        os.sched_setaffinity(0, cpus[1:])
        try:
            yield url
        finally:
            os.sched_setaffinity(0, cpus)


def guidellm(url, model, prompts_file, out):
    cmd = [os.path.join(VENV_BIN, "guidellm"), "run",
           "--backend", f"kind=openai_http,target={url},model={model},max_tokens={OUTPUT_TOKENS}",
           "--profile", "kind=synchronous", "--constraint", f"kind=max_requests,count={REQUESTS}",
           "--data", f"kind=json_file,path={prompts_file}", "--tokenizer", f"kind=huggingface_auto,model={model}",
           "--output", f"kind=json,path={out}", "--disable-console"]
    done = subprocess.run(cmd, env=PROXY_ENV, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())["benchmarks"][0]


def test_ttft_and_tpot_agree_with_guidellm(proxy_server, proxy_model_dir, tmp_path):
    model = str(proxy_model_dir)
    options = {name: spec.get("default") for name, spec in bench.ARGUMENT_SPEC.items()}
    options.update(url=proxy_server, model=model, prompt_tokens=PROMPT_TOKENS, max_tokens=OUTPUT_TOKENS,
                   requests=REQUESTS, warmup=1, settle_timeout=0)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": bench.prompt_for(options, i)}) + "\n"
                               for i in range(1, REQUESTS + 1)), encoding="utf-8")
    ours_runs, their_runs = [], []
    for n in range(2 * GUIDELLM_RUNS + 1):
        if n % 2:
            metrics = guidellm(proxy_server, model, prompts, tmp_path / f"guidellm-{n}.json")["metrics"]
            assert metrics["request_totals"]["successful"] == REQUESTS
            assert metrics["output_token_count"]["successful"]["median"] == OUTPUT_TOKENS
            # Both see the same prompt length (the server's usage).
            assert metrics["prompt_token_count"]["successful"]["median"] == pytest.approx(prompt_tokens, abs=1)
            # guidellm's TPOT: (e2e - TTFT) / (tokens - 1), like ours; both time the first content token.
            figure = (metrics["time_to_first_output_token_ms"]["successful"]["median"],
                      metrics["inter_token_latency_ms"]["successful"]["median"])
            their_runs.append(figure)
        else:
            ours, failure, _ = bench.run(options)
            assert failure is None
            assert ours["levels"][0]["output_tokens"] == REQUESTS * OUTPUT_TOKENS
            prompt_tokens = ours["levels"][0]["prompt_tokens_mean"]
            figure = (ours["summary"]["ttft_ms_p50"], ours["summary"]["tpot_ms_p50"])
            ours_runs.append(figure)
        print(f"\ncross-check run {n + 1} {'guidellm' if n % 2 else 'inference_benchmark'}: TTFT p50 {figure[0]:.1f} ms, "
              f"TPOT p50 {figure[1]:.1f} ms, 1-min load {os.getloadavg()[0]:.2f}")
    for i, name in enumerate(("TTFT", "TPOT")):
        ratios = [(ours_runs[k][i] + ours_runs[k + 1][i]) / 2 / theirs[i] for k, theirs in enumerate(their_runs)]
        mean = sum(ratios) / len(ratios)
        figures = (f"{name} p50, inference_benchmark / guidellm: each guidellm run against its bracket "
                   f"{[round(r, 3) for r in ratios]}, mean {mean:.3f}")
        print("cross-check", figures)
        assert mean == pytest.approx(1, abs=0.10), figures
