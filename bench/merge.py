#!/usr/bin/python3
"""Merges the per-suite JSON files of one bench/run.sh into one document.

Usage: bench/merge.py --work DIR --quick 0|1 --machine TEXT --bin DIR --out FILE

DIR holds what run.sh left there: limits.json, kv.json, master.json, state.json, scale.json,
python.json (or python-skipped), trace-<policy>-<tokens>.json (or trace-skipped), ha-*.json, commands.txt, failures.txt, started, load_before. A suite whose
file is missing is recorded as {"missing": true} so a failed suite shows in the report.
Standard library only (Debian's /usr/bin/python3).
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess

SUITES = ["limits", "kv", "python", "master", "state", "trace", "scale"]  # trace: see below


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def cpu_model():
    for line in read_text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--quick", default="0")
    parser.add_argument("--machine", default="")
    parser.add_argument("--bin", default="build/bin")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    suites = {}
    for name in SUITES:
        path = os.path.join(args.work, name + ".json")
        try:
            with open(path) as f:
                suites[name] = json.load(f)
        except (OSError, ValueError):
            suites[name] = {"missing": True}
    # Suites left out with bench/run.sh --suites are "skipped", not "missing".
    not_run = read_text(os.path.join(args.work, "suites-not-run")).split()
    for name in SUITES:
        if name in not_run:
            suites[name] = {"skipped": "not asked for (bench/run.sh --suites)"}
    # Suite 4 runs once per capacity: trace-<tokens>.json each.
    runs = []
    for name in sorted(os.listdir(args.work)):
        m = re.fullmatch(r"trace-(?:(\w+)-)?(\d+)\.json", name)
        if m:
            run = {"policy": m.group(1) or "default", "capacity_tokens": int(m.group(2))}
            try:
                with open(os.path.join(args.work, name)) as f:
                    run["result"] = json.load(f)
            except (OSError, ValueError):
                run["missing"] = True
            runs.append(run)
    if runs:
        suites["trace"] = {"runs": sorted(runs, key=lambda r: (r["capacity_tokens"], r["policy"]))}
    # Suite 4's simulator: trace-sim-<trace>.json, a row per policy and capacity.
    for name in sorted(os.listdir(args.work)):
        m = re.fullmatch(r"trace-sim-(\w+)\.json", name)
        if m:
            try:
                with open(os.path.join(args.work, name)) as f:
                    suites.setdefault("trace_sim", {})[m.group(1)] = json.load(f)
            except (OSError, ValueError):
                suites.setdefault("trace_sim", {})[m.group(1)] = {"missing": True}
    # Suite 7 (HA): ha-master-<alone|sync0|sync1>.json and ha-failover-<empty|full>.json.
    ha = {}
    for name in sorted(os.listdir(args.work)):
        m = re.fullmatch(r"ha-(master|failover)-(\w+)\.json", name)
        if m:
            try:
                with open(os.path.join(args.work, name)) as f:
                    ha.setdefault(m.group(1), {})[m.group(2)] = json.load(f)
            except (OSError, ValueError):
                ha.setdefault(m.group(1), {})[m.group(2)] = {"missing": True}
    suites["ha"] = ha if ha else {"missing": True}
    if "ha" in read_text(os.path.join(args.work, "suites-not-run")).split():
        suites["ha"] = {"skipped": "not asked for (bench/run.sh --suites)"}
    if read_text(os.path.join(args.work, "python-skipped")):
        suites["python"] = {"skipped": read_text(os.path.join(args.work, "python-skipped"))}
    skipped = read_text(os.path.join(args.work, "trace-skipped"))
    if skipped:
        suites["trace"] = {"skipped": skipped}

    mem_kib = 0
    for line in read_text("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    doc = {
        "schema": 1,
        "started_utc": read_text(os.path.join(args.work, "started")),
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": args.quick == "1",
        "machine": {
            "summary": args.machine,
            "cores": os.cpu_count(),
            "memory_gib": round(mem_kib / 1048576, 1),
            "cpu": cpu_model(),
            "kernel": platform.release(),
            "load_before": read_text(os.path.join(args.work, "load_before")),
        },
        "git": {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))},
        "binaries": args.bin,
        "commands": [c for c in read_text(os.path.join(args.work, "commands.txt")).splitlines() if c],
        "failures": [f for f in read_text(os.path.join(args.work, "failures.txt")).splitlines() if f],
        "suites": suites,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
