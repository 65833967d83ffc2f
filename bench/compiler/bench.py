#!/usr/bin/env python3
"""Times `miles check` on the generated 100-module library against references measured in the
same run: `miles --version` (the binary's start-up alone) and `jq empty` on a JSON file of the
same byte size. Prints medians of N runs.

usage: bench.py MILES_BINARY LIBRARY_DIR [N]
"""
import json
import os
import statistics
import subprocess
import sys
import time


def median_ms(cmd, n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append((time.perf_counter() - t) * 1000)
        if r.returncode != 0:
            sys.exit(f"{cmd} failed ({r.returncode}): {r.stderr.decode()[-2000:]}")
    return statistics.median(times), min(times), max(times)


def main():
    miles, lib = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    files = sorted(os.path.join(lib, f) for f in os.listdir(lib) if f.endswith(".miles"))
    size = sum(os.path.getsize(f) for f in files)
    lines = sum(open(f).read().count("\n") for f in files)
    # A JSON document of the same byte size: records like the library's schemas.
    rec = {"name": "settings", "workers": 8, "memory": "512.MiB", "rate": 0.5, "tags": ["gen", "bench"]}
    items, text = [], "[]"
    while len(text) < size:
        items.append(dict(rec, id=len(items)))
        text = json.dumps(items, indent=2)
    path = os.path.join(lib, "..", "same-size.json")
    with open(path, "w") as f:
        f.write(text)
    main_file = os.path.join(lib, "main.miles")
    check = median_ms([miles, "check", main_file], n)
    start = median_ms([miles, "--version"], n)
    jq = median_ms(["jq", "empty", path], n)
    compile_ms = check[0] - start[0]
    print(f"library: {len(files)} modules, {lines} lines, {size} bytes; JSON reference {len(text)} bytes")
    print(f"runs: {n} each, median (min..max) in ms")
    print(f"miles check      {check[0]:8.1f}  ({check[1]:.1f}..{check[2]:.1f})")
    print(f"miles --version  {start[0]:8.1f}  ({start[1]:.1f}..{start[2]:.1f})   start-up alone")
    print(f"jq empty         {jq[0]:8.1f}  ({jq[1]:.1f}..{jq[2]:.1f})")
    print(f"check - start-up {compile_ms:8.1f}  -> {lines / (compile_ms / 1000):,.0f} lines/s")
    print(f"check / jq       {check[0] / jq[0]:8.2f}x   (check - start-up) / jq {compile_ms / jq[0]:.2f}x")
    print(f"end to end       {lines / (check[0] / 1000):,.0f} lines/s")


main()
