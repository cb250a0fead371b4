"""Prints bench/security.sh's results as the markdown table of docs/benchmarks.md: each case's
median over the rounds without a secret, with one, as a tenant, and with the secret and mutual
TLS, and the costs (secret / open - 1, tenant / open - 1, tls / open - 1).

    python3 bench/security_table.py bench/results/security-<stamp>
"""

import glob
import json
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main(out):
    cases = {}  # (case name, unit) -> {"open": [...], "secret": [...]}

    def add(name, unit, mode, value):
        modes = cases.setdefault((name, unit), {"open": [], "secret": [], "tenant": [], "tls": []})
        modes[mode].append(value)

    for path in sorted(glob.glob(os.path.join(out, "kv-*.json"))):
        mode = os.path.basename(path).split("-")[1]
        for r in load(path)["results"]:
            if r["errors"]:
                sys.exit(f"{path}: {r['target']} {r['op']} had {r['errors']} errors")
            add(f"{r['target']} {r['size_text']} {r['op']}, 1 client", "objects/s", mode,
                r["objects_per_s"])
            add(f"{r['target']} {r['size_text']} {r['op']}, 1 client", "p50 us", mode, r["p50_us"])
    for path in sorted(glob.glob(os.path.join(out, "master-*.json"))):
        _, transport, mode, _ = os.path.basename(path).split("-", 3)
        for r in load(path):
            if r["op"] == "tcp":
                continue
            if r["errors"]:
                sys.exit(f"{path}: {r['op']} had {r['errors']} errors")
            add(f"master {r['op']} batch of {r['batch']}, {transport}", "batches/s", mode,
                r["batches_per_s"])

    limits = load(os.path.join(out, "limits.json"))
    memcpy = {k: v for k, v in limits.items() if k.startswith("memcpy")}
    print(f"limits (same run): memcpy {', '.join(f'{k} {v:.1f} GB/s' for k, v in memcpy.items())}; "
          f"loopback TCP 1 stream {limits.get('tcp_1_streams', 0):.2f} GB/s, round trip "
          f"{limits.get('tcp_rtt_64B_p50_us', 0):.1f} us p50")
    print()
    print("| case | unit | without a secret | with a secret | cost | as a tenant | cost "
          "| secret + TLS | cost |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (name, unit), v in cases.items():
        if not v["open"] or not v["secret"]:
            continue
        a, b = statistics.median(v["open"]), statistics.median(v["secret"])

        def cost(x):  # throughput: a lower rate is a cost; latency: a higher one is
            return (a / x - 1) if unit != "p50 us" else (x / a - 1)

        def column(mode):
            if not v[mode]:
                return "| - | -"
            t = statistics.median(v[mode])
            return f"| {t:,.0f} | {100 * cost(t):+.1f}%"

        print(f"| {name} | {unit} | {a:,.0f} | {b:,.0f} | {100 * cost(b):+.1f}% "
              f"{column('tenant')} {column('tls')} |")


if __name__ == "__main__":
    main(sys.argv[1])
