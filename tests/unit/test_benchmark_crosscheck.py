"""library/inference_benchmark.py against guidellm, a well-kept benchmarking tool of the field, on one real service.

Both send the same prompts (requests 1 to 8 of the module's own sequence) for the same output length to the same
`transformers serve`, one request at a time; their TTFT and time per output token must agree within 10 %.
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
PROMPT_TOKENS, OUTPUT_TOKENS, REQUESTS = 128, 32, 8


@pytest.fixture(scope="module")
def proxy_server(proxy_model_dir, tmp_path_factory):
    # One engine thread: the other CPU is left to the two clients (guidellm runs several processes).
    with serve(proxy_model_dir, tmp_path_factory.mktemp("serve-2l"), threads=1) as url:
        yield url


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
    ours, failure, _ = bench.run(options)
    assert failure is None
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": bench.prompt_for(options, i)}) + "\n"
                               for i in range(1, REQUESTS + 1)), encoding="utf-8")
    theirs = guidellm(proxy_server, model, prompts, tmp_path / "guidellm.json")
    metrics = theirs["metrics"]
    assert metrics["request_totals"]["successful"] == REQUESTS
    assert metrics["output_token_count"]["successful"]["median"] == OUTPUT_TOKENS
    assert ours["levels"][0]["output_tokens"] == REQUESTS * OUTPUT_TOKENS
    # Both see the same prompt length (the server's usage), both time the first content token.
    assert metrics["prompt_token_count"]["successful"]["median"] == pytest.approx(
        ours["levels"][0]["prompt_tokens_mean"], abs=1)
    ttft = metrics["time_to_first_output_token_ms"]["successful"]["median"]
    tpot = metrics["inter_token_latency_ms"]["successful"]["median"]  # guidellm: (e2e - TTFT) / (tokens - 1)
    figures = (f"TTFT p50 ms: inference_benchmark {ours['summary']['ttft_ms_p50']}, guidellm {round(ttft, 3)}; "
               f"TPOT p50 ms: inference_benchmark {ours['summary']['tpot_ms_p50']}, guidellm {round(tpot, 3)}")
    print("\ncross-check", figures)
    assert ours["summary"]["ttft_ms_p50"] == pytest.approx(ttft, rel=0.10), figures
    assert ours["summary"]["tpot_ms_p50"] == pytest.approx(tpot, rel=0.10), figures
