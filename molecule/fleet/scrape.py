#!/usr/bin/env python3
"""Scrape a Prometheus endpoint as a Prometheus server would and parse it with the Prometheus client's text parser.

    scrape.py URL [--key KEY] [--prefix PREFIX ...]

Prints JSON: {"status": HTTP status, "samples": {'name{label="value",...}': value}} with the samples whose names
start with a PREFIX (all without one).
"""

import argparse
import json
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--key", default="")
    parser.add_argument("--prefix", action="append", default=[])
    args = parser.parse_args()
    request = urllib.request.Request(args.url, headers={"Authorization": f"Bearer {args.key}"} if args.key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, text = response.status, response.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        print(json.dumps({"status": error.code, "samples": {}}))
        return
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if args.prefix and not sample.name.startswith(tuple(args.prefix)):
                continue
            labels = ",".join(f'{name}="{value}"' for name, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    print(json.dumps({"status": status, "samples": samples}, sort_keys=True))


if __name__ == "__main__":
    main()
