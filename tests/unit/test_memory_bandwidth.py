"""library/memory_bandwidth.py: safetensors header sizes, the roofline formula and a real probe run."""

import json
import os
import struct
import sys

import pytest

import memory_bandwidth as mb  # library/ is on sys.path via conftest

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402  (an independent reader/writer of the format)


def write_model(folder, tensors, **config):
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def params(**overrides):
    values = {name: spec.get("default") for name, spec in mb.ARGUMENT_SPEC.items()}
    values.update(python=sys.executable, cpus="0", threads=1, size_mb=16, repeats=2)
    values.update(overrides)
    return values


LAYER = {"num_hidden_layers": 1, "hidden_size": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 2, "dtype": "float32"}


def test_untied_embedding_counts_one_row(tmp_path):
    path = write_model(tmp_path, {"model.embed_tokens.weight": torch.zeros(10, 4),
                                  "lm_head.weight": torch.zeros(10, 4),
                                  "model.layers.0.mlp.weight": torch.zeros(4, 4, dtype=torch.bfloat16)},
                       tie_word_embeddings=False, **LAYER)
    got = mb.model_bytes_per_token(path, "auto", context_tokens=100)
    # lm_head 160 B + one embedding row 16 B + layer 32 B (bf16); KV: 1 layer x (K, V) x 1 head x 2 x 100 x 4 B.
    assert got == {"parameters": 96, "stored_bytes": 352, "tied_embeddings": False,
                   "weight_bytes_per_token": 208, "kv_bytes_per_token": 1600, "bytes_per_token": 1808}
    as_fp32 = mb.model_bytes_per_token(path, "float32", context_tokens=100)
    assert (as_fp32["weight_bytes_per_token"], as_fp32["kv_bytes_per_token"]) == (160 + 16 + 64, 1600)


def test_tied_real_proxy_reads_every_stored_byte(tiny_proxy_dir):
    path = str(tiny_proxy_dir)
    weights = os.path.join(path, "model.safetensors")
    with open(weights, "rb") as handle:
        (header,) = struct.unpack("<Q", handle.read(8))
    with open(os.path.join(path, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    got = mb.model_bytes_per_token(path, "auto", context_tokens=10)
    assert config["tie_word_embeddings"] is True and got["tied_embeddings"] is True
    # Every stored byte (file size minus the header) is read once per token.
    assert got["weight_bytes_per_token"] == got["stored_bytes"] == os.path.getsize(weights) - 8 - header
    assert got["parameters"] == sum(tensor.numel() for tensor in load_file(weights).values())
    assert got["kv_bytes_per_token"] == (config["num_hidden_layers"] * 2 * config["num_key_value_heads"]
                                         * config["head_dim"] * 10 * 2)


def test_probe_runs_pinned_and_gives_the_upper_bound(tmp_path):
    path = write_model(tmp_path, {"lm_head.weight": torch.zeros(1000, 1000)}, **LAYER)
    result, failure = mb.run(params(model_path=path, context_tokens=0))
    assert failure is None
    probe = result["probe"]
    assert (probe["cpus"], probe["threads"], probe["bytes"]) == ([0], 1, 16 * 2**20)
    assert probe["engine"].startswith("torch ")
    # The figure is the median of the last `repeats` passes (median_s is rounded to the nanosecond).
    assert result["bandwidth_gb_s"] == pytest.approx(probe["bytes"] / probe["median_s"] / 1e9, rel=1e-3)
    assert probe["best_s"] <= probe["median_s"]
    assert 2 <= probe["passes"] <= 40
    assert probe["stable"] == (probe["spread_percent"] <= 5.0)
    assert result["model"]["bytes_per_token"] == 4_000_000
    assert result["decode_upper_bound_tokens_per_s"] == round(result["bandwidth_gb_s"] * 1e9 / 4_000_000, 3)


def test_probe_stops_when_the_last_passes_agree():
    result, failure = mb.run(params(repeats=3, spread_percent=1e9, max_passes=30))
    assert failure is None
    # A band no spread can leave is met at once, even on a loaded machine: exactly `repeats` passes.
    assert (result["probe"]["passes"], result["probe"]["stable"]) == (3, True)
    # An impossible band runs every pass and says the figure is not stable.
    result, failure = mb.run(params(repeats=3, spread_percent=1e-9, max_passes=6))
    assert failure is None
    assert (result["probe"]["passes"], result["probe"]["stable"]) == (6, False)


def test_the_probe_runs_in_a_scope_of_the_service_slice(tmp_path):
    """Issue 39, kind 4: the probe gets the service's slice limits, not the login's. systemd-run is a stand-in that
    records its options and executes the command in place, as the real one does with --scope."""
    log = tmp_path / "systemd-run.args"
    fake = tmp_path / "systemd-run"
    fake.write_text('#!/bin/sh\necho "$@" > %s\nwhile [ "$1" != -- ]; do shift; done\nshift\nexec "$@"\n' % log)
    fake.chmod(0o755)
    result, failure = mb.run(params(slice="inference.slice", repeats=2, spread_percent=1e9), systemd_run=str(fake))
    assert failure is None
    assert log.read_text().split(" -- ")[0] == "--scope --quiet --slice=inference.slice"
    assert (result["probe"]["slice"], result["probe"]["cpus"]) == ("inference.slice", [0])
    # Without systemd (or with slice ""), the module's own cgroup.
    result, failure = mb.run(params(repeats=2, spread_percent=1e9))
    assert failure is None and result["probe"]["slice"] is None


def test_a_given_bandwidth_skips_the_probe(tmp_path):
    path = write_model(tmp_path, {"lm_head.weight": torch.zeros(1000, 1000)}, **LAYER)
    result, failure = mb.run(params(model_path=path, context_tokens=0, bandwidth_gb_s=20.0, python="/nonexistent"))
    assert failure == "python /nonexistent is not an executable file (is the service installed?)"
    result, failure = mb.run(params(model_path=path, context_tokens=0, bandwidth_gb_s=20.0))
    assert failure is None and "probe" not in result
    assert (result["bandwidth_gb_s"], result["decode_upper_bound_tokens_per_s"]) == (20.0, 5000.0)


def test_without_the_probe_only_the_model_is_read(tmp_path):
    """probe=false sizes a KV cache (the inference_service role's for vLLM): no bandwidth, no Python of the service."""
    path = write_model(tmp_path, {"lm_head.weight": torch.zeros(10, 4)}, **LAYER)
    result, failure = mb.run(params(model_path=path, context_tokens=4096, probe=False, python="/nonexistent",
                                    dtype="bfloat16"))
    # 1 layer x (K, V) x 1 KV head x head_dim 2 x 4096 tokens x 2 bytes.
    assert failure is None and set(result) == {"changed", "model"}
    assert result["model"]["kv_bytes_per_token"] == 1 * 2 * 1 * 2 * 4096 * 2
    assert mb.run(params(probe=False)) == ({"changed": False}, "probe=false needs model_path (the model is all it reads)")


@pytest.mark.parametrize("overrides, message", [
    ({"spread_percent": 0.0}, "spread_percent must be > 0 and max_passes >= 1"),
    ({"bandwidth_gb_s": -1.0}, "bandwidth_gb_s must be > 0"),
    ({"cpus": "0-x"}, "cpus must be CPU numbers or ranges (CPUAffinity= syntax), got '0-x'"),
    ({"python": "/nonexistent/python"},
     "python /nonexistent/python is not an executable file (is the service installed?)"),
    ({"repeats": 0}, "threads, size_mb and repeats must be >= 1 and context_tokens >= 0"),
])
def test_bad_options(overrides, message):
    assert mb.run(params(**overrides)) == ({"changed": False}, message)


def test_missing_weights_and_cpu_outside_affinity(tmp_path):
    assert mb.run(params(model_path=str(tmp_path))) == ({"changed": False}, f"no *.safetensors in {tmp_path}")
    result, failure = mb.run(params(cpus=str(max(os.sched_getaffinity(0)) + 1)))
    assert failure.startswith(f"cannot run the probe with {sys.executable}: ")


def write_gguf(path, tensors, layers=1, embedding=4, heads=2, kv_heads=1, key_length=2):
    """A GGUF file written by the gguf library (llama.cpp's own writer), qwen3 metadata."""
    import gguf  # noqa: PLC0415  (controller requirement; only these tests need it)
    import numpy  # noqa: PLC0415
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_block_count(layers)
    writer.add_embedding_length(embedding)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(key_length)
    writer.add_value_length(key_length)
    for name, shape in tensors.items():
        writer.add_tensor(name, numpy.zeros(shape, dtype=numpy.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_gguf_untied_counts_one_embedding_row(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", {"token_embd.weight": (10, 4), "output.weight": (10, 4),
                                            "blk.0.ffn_up.weight": (4, 4)})
    result, failure = mb.run(params(model_path=path, context_tokens=100))
    assert failure is None
    # output 160 B + one embedding row 16 B + layer 64 B (f32); KV: 1 layer x (K 2 + V 2) x 1 head x 100 x 2 B (f16).
    assert result["model"] == {"parameters": 96, "stored_bytes": 384, "tied_embeddings": False,
                               "weight_bytes_per_token": 240, "kv_bytes_per_token": 800, "bytes_per_token": 1040,
                               "table_cached": False}


def test_gguf_tied_reads_the_embedding_in_full_and_refuses_a_dtype(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", {"token_embd.weight": (10, 4)}, layers=2, kv_heads=2)
    got = mb.gguf_bytes_per_token(sys.executable, path, context_tokens=10, timeout=60)
    assert (got["tied_embeddings"], got["weight_bytes_per_token"], got["kv_bytes_per_token"]) == (True, 160, 320)
    assert mb.run(params(model_path=path, dtype="float32")) == (
        {"changed": False}, "dtype must be auto for a GGUF file (it stores its own types), got float32")


def test_gguf_table_is_cached_until_the_file_changes(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", {"token_embd.weight": (10, 4)})
    cache = tmp_path / "cache"
    first = mb.gguf_bytes_per_token(sys.executable, path, context_tokens=10, timeout=60, cache_dir=str(cache))
    second = mb.gguf_bytes_per_token(sys.executable, path, context_tokens=10, timeout=60, cache_dir=str(cache))
    assert (first.pop("table_cached"), second.pop("table_cached")) == (False, True)
    assert first == second and len(list(cache.iterdir())) == 1
    # Another file at the same path (a new conversion): read again, not the old table.
    write_gguf(tmp_path / "m.gguf", {"token_embd.weight": (20, 4)})
    third = mb.gguf_bytes_per_token(sys.executable, path, context_tokens=10, timeout=60, cache_dir=str(cache))
    assert (third["table_cached"], third["parameters"]) == (False, 80)


def test_gguf_table_cache_that_cannot_be_written_reads_each_time(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", {"token_embd.weight": (10, 4)})
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for _ in range(2):
        got = mb.gguf_bytes_per_token(sys.executable, path, context_tokens=10, timeout=60, cache_dir=str(blocker / "x"))
        assert (got["table_cached"], got["parameters"]) == (False, 40)


def test_gguf_table_cache_write_that_fails_leaves_no_part_file(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "m.gguf", {"token_embd.weight": (10, 4)})
    cache = tmp_path / "cache"

    def full_disk(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mb.os, "replace", full_disk)
    got = mb.gguf_bytes_per_token(sys.executable, path, context_tokens=10, timeout=60, cache_dir=str(cache))
    assert (got["table_cached"], got["parameters"]) == (False, 40)
    assert list(cache.iterdir()) == []
