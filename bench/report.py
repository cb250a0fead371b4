#!/usr/bin/python3
"""Turns one merged bench/run.sh result into the markdown tables and plots of docs/benchmarks.md.

  bench/report.py bench/results/STAMP.json                 # print the tables
  bench/report.py bench/results/STAMP.json --plots PREFIX  # also PREFIX-*.png (gnuplot)
  bench/report.py bench/results/STAMP.json --doc docs/benchmarks.md --plots docs/img/bench
      # rewrite the generated blocks of the doc in place, and its plots

In the doc, each suite's tables live between `<!-- report:NAME -->` and `<!-- /report:NAME -->`
(NAME: run, limits, kv-put, kv-get, python, master, state, scale, trace); text outside the markers is
left alone, so the analysis survives a regeneration. Standard library only.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

TARGETS = ["granary-shm", "granary-shm-cold", "granary-tcp", "redis", "memcached"]


def num(x, digits=0):
    if x is None:
        return "–"
    return f"{x:,.{digits}f}"


def size_text(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def missing(suite):
    if not isinstance(suite, dict):
        return None  # master and state results are plain lists
    if "skipped" in suite:
        return f"_Not run: {suite['skipped']}_"
    if suite.get("missing"):
        return "_No results: the suite failed or did not run (see `failures` in the JSON)._"
    return None


def run_block(doc, path):
    m = doc["machine"]
    quick = " with `--quick` (shorter cases, smaller counts)" if doc.get("quick") else ""
    lines = [
        f"Run {doc['started_utc']} to {doc['finished_utc']}{quick}, commit "
        f"`{doc['git']['commit'][:12]}`{' (with local changes)' if doc['git'].get('dirty') else ''}.",
        f"Machine: {m['summary']}; kernel {m['kernel']}; load average before the run {m['load_before']}.",
        f"Raw: `{path}` (every suite, the machine, and each command run).",
    ]
    if doc.get("failures"):
        lines.append("Failures in this run: " + "; ".join(f"`{f}`" for f in doc["failures"]))
    return "\n".join(lines)


def limits_block(s):
    names = [
        ("memcpy_64KiB", "memcpy, 1 thread, 64 KiB blocks"),
        ("memcpy_4096KiB", "memcpy, 1 thread, 4 MiB blocks"),
        *[(k, f"memcpy, {k.split('_')[2]} threads, 4 MiB blocks") for k in sorted(s)
          if re.fullmatch(r"memcpy_4096KiB_\d+_threads", k)],
        ("tcp_1_streams", "loopback TCP, 1 stream"),
        ("tcp_2_streams", "loopback TCP, 2 streams"),
        ("tcp_4_streams", "loopback TCP, 4 streams"),
        ("tcp_answer_4MiB", "loopback TCP, one 4 MiB answer to a 64-byte request (p50)"),
        ("disk_write_odirect", "disk write, O_DIRECT, 1 MiB blocks"),
        ("disk_read_odirect", "disk read, O_DIRECT, 1 MiB blocks"),
    ]
    names += [
        ("copy_64KiB_memcpy", "copy 64 KiB blocks, glibc memcpy"),
        ("copy_64KiB_vector", "copy 64 KiB blocks, 16-byte vector loop"),
        ("copy_4MiB_memcpy", "copy 4 MiB blocks, glibc memcpy"),
        ("copy_4MiB_vector", "copy 4 MiB blocks, 16-byte vector loop"),
        ("shm_first_write", "shared memory, first write through a new mapping"),
        ("shm_second_write", "shared memory, second write, same mapping"),
        ("shm_write_after_warm", "shared memory, write through a new mapping after its warm-up"),
    ]
    rows = [(label, num(s[k], 2)) for k, label in names if k in s]
    if "shm_warm_seconds_per_gib" in s:
        rows.append(("warm-up of a new mapping (MADV_POPULATE_READ)",
                     f"{s['shm_warm_seconds_per_gib']:.3f} s/GiB"))
    if "tcp_rtt_64B_p50_us" in s:
        rows.append(("loopback TCP round trip, 64 bytes",
                     f"p50 {s['tcp_rtt_64B_p50_us']:.1f} µs, p99 {s['tcp_rtt_64B_p99_us']:.1f} µs"))
    if "tcp_answer_4MiB_p50_us" in s:
        rows.append(("loopback TCP, one 4 MiB answer, time per call",
                     f"p50 {s['tcp_answer_4MiB_p50_us']:.0f} µs, "
                     f"p99 {s['tcp_answer_4MiB_p99_us']:.0f} µs"))
    return table(["limit", "GB/s"], rows)


def kv_index(s):
    return {(r["target"], r["size"], r["op"], r["clients"]): r for r in s["results"]}


def kv_block(s, op):
    idx = kv_index(s)
    sizes = sorted({r["size"] for r in s["results"]})
    clients = sorted({r["clients"] for r in s["results"]})
    rows = []
    for size in sizes:
        for c in clients:
            base = {t: idx.get((t, size, op, c)) for t in ("redis", "memcached")}
            for t in TARGETS:
                r = idx.get((t, size, op, c))
                if r is None:
                    continue
                vs = []
                for other in ("redis", "memcached"):
                    b = base[other]
                    vs.append(f"{r['gbps'] / b['gbps']:.2f}x" if b and b["gbps"] > 0 and t.startswith("granary") else "")
                limit = re.sub(r"memcpy_4096KiB_(\d+)_threads", r"memcpy \1 threads", r["limit"])
                limit = limit.replace("memcpy_4096KiB", "memcpy").replace("tcp_", "tcp ").replace("_streams", "")
                limit = limit.replace("shm_first_write", "first write")
                rows.append((size_text(size), c, t, num(r["objects_per_s"]), num(r["gbps"], 2),
                             f"{100 * r['fraction_of_limit']:.0f}% ({limit})", num(r["p50_us"]),
                             num(r["p99_us"]), num(r["p999_us"]), vs[0], vs[1],
                             r["errors"] or ""))
    return table(["size", "clients", "target", "objects/s", "GB/s", "of limit", "p50 µs", "p99 µs",
                  "p999 µs", "x Redis", "x memcached", "errors"], rows)


def master_block(s):
    rows = [(r["op"], r["threads"], num(r["batches_per_s"]), num(r["keys_per_s"]) if r["op"] != "ping" else "–",
             num(r["p50_us"]), num(r["p99_us"]), r["errors"] or "") for r in s]
    return table(["op", "clients", "batches/s", "keys/s", "p50 µs/batch", "p99 µs/batch", "errors"], rows)


def state_block(s):
    return table(["op", "threads", "keys/s"], [(r["op"], r["threads"], num(r["keys_per_s"])) for r in s])


# Master calls per batch in `granary-bench master` (put: start + end; get: replica list + finish).
MASTER_CALLS = {"put": 2, "get": 2, "exist": 1}


def master_ratio_block(master, state):
    """One client over the wire against the state machine alone, and against the most a
    synchronous client could reach: per batch, its round trips plus the state machine's time."""
    one = {r["op"]: r for r in master if r["threads"] == 1}
    st = {r["op"]: r for r in state if r["threads"] == 1}
    rtt = one.get("tcp", {}).get("p50_us")
    rows = []
    for op, calls in MASTER_CALLS.items():
        if op not in one or op not in st or not rtt:
            continue
        batch = one[op]["batch"]
        state_us = batch / st[op]["keys_per_s"] * 1e6
        ceiling = batch / ((calls * rtt + state_us) / 1e6)
        got = one[op]["keys_per_s"]
        rows.append((op, num(got), num(st[op]["keys_per_s"]), f"{100 * got / st[op]['keys_per_s']:.0f}%",
                     f"{calls} x {rtt:.0f} + {state_us:.0f}", num(ceiling),
                     f"{100 * got / ceiling:.0f}%"))
    return table(["op", "1 client keys/s", "state machine keys/s", "of the state machine",
                  "floor µs/batch: round trips + state", "ceiling keys/s", "of the ceiling"], rows)


def scale_block(s):
    rows = []
    for step in s["steps"]:
        for i, e in enumerate(step["exist"]):
            first = i == 0
            rows.append((num(step["objects"]) if first else "",
                         num(step["rss_bytes"] / 1048576, 0) if first else "",
                         num(step["bytes_per_object"]) if first else "",
                         num(step["put_keys_per_s"]) if first else "",
                         e["threads"], num(e["keys_per_s"]), num(e["p50_us"]), num(e["p99_us"])))
    head = (f"Objects of {s['value_size']} B, 1 replica, keys of {s['key_bytes']} B; "
            f"master RSS before the first put: {s['rss_before_bytes'] / 1048576:.0f} MiB; "
            f"exist batches of {s['exist_batch']} random stored keys.\n\n")
    out = head + table(["objects", "master RSS MiB", "bytes/object", "put keys/s", "exist clients",
                        "exist keys/s", "p50 µs/batch", "p99 µs/batch"], rows)
    offload = [(num(step["objects"]), step["offload"]) for step in s["steps"] if "offload" in step]
    if offload:
        o0 = offload[0][1]
        out += (f"\n\nOffloadStart at that size: {o0['eager_keys']} objects of persistence eager "
                f"put, then a node asks for {o0['keys_per_call']} keys a call until an answer "
                f"names none (its idle round).\n\n")
        out += table(["objects", "calls", "keys offloaded", "ms per call naming keys (p50)",
                      "ms for the idle call"],
                     [(n, o["calls"], num(o["offloaded"]), num(o["naming_call_p50_ms"], 2),
                       num(o["idle_call_ms"], 2)) for n, o in offload])
        grown = [step for step in s["steps"] if "offload_index_bytes" in step]
        if grown:
            g = grown[0]
            out += (f"\n\nThe first disk's registration at {num(g['objects'])} objects started the "
                    f"offload index: master RSS +{g['offload_index_bytes'] / 1048576:.0f} MiB "
                    f"({g['offload_index_bytes'] / g['objects']:.0f} B per object).")
    copies = [(num(step["objects"]), step["rereplicate"]) for step in s["steps"]
              if "rereplicate" in step]
    if copies:
        out += ("\n\nReplicaCopyStart at that size: a node mounts a segment (the replica epoch "
                "moves, nothing is short), then 2000 objects spread over the store are raised to "
                "2 replicas and the node asks for 256 a call, each reported copied, until all are; "
                "then a drain begins, and the next call walks every object once: what every "
                "call after an epoch move cost before the planner's index.\n\n")
        out += table(["objects", "ms, call after the mount", "ms, first call after the raise",
                      "ms per call naming keys (p50)", "copies", "calls", "ms, Drain call",
                      "ms, the call after the drain (walks every object)"],
                     [(n, num(c["idle_call_ms"], 2), num(c["first_call_ms"], 2),
                       num(c["naming_call_p50_ms"], 2), num(c["copied"]), c["calls"],
                       num(c.get("drain_call_ms"), 1), num(c.get("drain_walk_call_ms"), 1))
                      for n, c in copies])
    return out


# Prefix hit rates of ../shared/workloads/README.md, by capacity in tokens.
TRACE_REFERENCE = {1_000_000: {"LRU": 0.054, "S3-FIFO": 0.079, "Belady": 0.258, "infinite": 0.374},
                   3_000_000: {"LRU": 0.138, "S3-FIFO": 0.159, "Belady": 0.360, "infinite": 0.374,
                               "Mooncake Store": 0.116}}


def trace_block(s):
    runs = [r for r in s.get("runs", []) if isinstance(r.get("result"), dict)]
    if not runs:
        return "```json\n" + json.dumps(s, indent=1)[:4000] + "\n```"
    rows = []
    for run in runs:
        r, cap = run["result"], run["capacity_tokens"]
        ref = TRACE_REFERENCE.get(cap, {})
        refs = ", ".join(f"{k} {v:.3f}" for k, v in ref.items())
        rows.append((num(cap), run.get("policy", "default"), f"**{r['hit_rate']:.3f}**", refs,
                     f"{r['requests']:,}", num(r["get_bytes"] / 1e9, 2), num(r["put_bytes"] / 1e9, 2),
                     num(r["seconds"], 1), num(r["requests_per_s"]), r.get("vanished_blocks", 0)))
    first = runs[0]["result"]
    head = (f"Blocks of 512 tokens x {first['bytes_per_token']} B = {size_text(first['block_bytes'])}; "
            f"lookup `{first['lookup']}`, data path `{first['path']}`; the node's segment holds "
            "capacity / 512 blocks.\n\n")
    return head + table(["capacity tokens", "policy", "hit rate", "reference (workloads README)",
                         "requests", "got GB", "put GB", "wall s", "requests/s",
                         "vanished between check and get"], rows)


def python_block(s):
    rows = [(r["api"], r["op"], size_text(r["size"]), r["batch"], num(r["ops_per_s"]),
             num(r["gb_per_s"], 2), num(r["p50_us"]), num(r["p99_us"])) for r in s["rows"]]
    return table(["API", "call", "size", "objects per call", "calls/s", "GB/s", "p50 µs",
                  "p99 µs"], rows)


def ha_master_block(s):
    """keys/s of the same batches against a master alone, an HA leader with an asynchronous
    standby and one with a synchronous standby; the synchronous standby's cost against each."""
    runs = s.get("master", {})
    alone = {(r["op"], r["threads"]): r for r in runs.get("alone", []) if isinstance(r, dict)}
    rows = []
    for (op, threads), base in sorted(alone.items()):
        if op not in ("put", "get", "exist"):
            continue
        a = next((r for r in runs.get("sync0", []) if r["op"] == op and r["threads"] == threads), None)
        b = next((r for r in runs.get("sync1", []) if r["op"] == op and r["threads"] == threads), None)
        cost = lambda r, ref: f"{100 * (1 - r['keys_per_s'] / ref['keys_per_s']):.0f}%" if r and ref else "–"
        rows.append((op, threads, num(base["keys_per_s"]), num(a["keys_per_s"]) if a else "–",
                     num(b["keys_per_s"]) if b else "–", cost(b, a), cost(b, base),
                     num(b["p50_us"]) if b else "–"))
    return table(["op", "clients", "alone keys/s", "HA async keys/s", "HA sync keys/s",
                  "sync cost vs async", "sync cost vs alone", "sync p50 µs/batch"], rows)


def ha_failover_block(s):
    rows = []
    for cache, r in sorted(s.get("failover", {}).items()):
        if r.get("missing"):
            rows.append((cache, "–", "–", "–", "failed"))
            continue
        rows.append((cache, r["kills"], num(r["median_ms"]), num(r["max_ms"]),
                     f"{r['readable']}/{r['acknowledged']}", r.get("wrong", "–")))
    return table(["cache", "kills", "median ms (kill -9 to first put)", "max ms",
                  "acknowledged objects read back exact", "wrong reads"], rows)


def blocks(doc, path):
    su = doc["suites"]
    out = {"run": run_block(doc, path)}
    for name, fn in (("limits", limits_block), ("master", master_block), ("state", state_block),
                     ("scale", scale_block), ("trace", trace_block), ("python", python_block)):
        out[name] = missing(su.get(name, {"missing": True})) or fn(su[name])
    both = [su.get(n, {"missing": True}) for n in ("master", "state")]
    out["master-ratio"] = missing(both[0]) or missing(both[1]) or master_ratio_block(*both)
    ha = su.get("ha", {"missing": True})
    out["ha-master"] = missing(ha) or ha_master_block(ha)
    out["ha-failover"] = missing(ha) or ha_failover_block(ha)
    kv = su.get("kv", {"missing": True})
    for op in ("put", "get"):
        out["kv-" + op] = missing(kv) or kv_block(kv, op)
    return out


# ---- plots (gnuplot) ----

def gnuplot(script, data_files):
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in data_files.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        subprocess.run(["gnuplot"], input=script, text=True, cwd=tmp, check=True)


def plot_kv(s, prefix):
    idx = kv_index(s)
    sizes = sorted({r["size"] for r in s["results"]})
    clients = sorted({r["clients"] for r in s["results"]})
    data = {}
    for op in ("put", "get"):
        for c in clients:
            for t in TARGETS:
                rows = [idx.get((t, z, op, c)) for z in sizes]
                data[f"{op}-{c}-{t}.dat"] = "".join(
                    f"{z / 1024:.0f} {r['gbps']} {r['p50_us']} {r['p99_us']} {r['p999_us']}\n"
                    for z, r in zip(sizes, rows) if r)
    tics = ", ".join(f'"{size_text(z)}" {z / 1024:.0f}' for z in sizes)
    head = ('set terminal pngcairo size 1200,500 font ",10"\nset logscale x 2\nset grid\n'
            f'set xtics ({tics})\nset xlabel "value size"\nset key top left\n'
            'set offsets graph 0.03, graph 0.06, 0, 0\n')  # room for the end tics' labels
    for op in ("put", "get"):
        script = head + f'set output "{os.path.abspath(prefix)}-kv-{op}.png"\nset multiplot layout 1,{len(clients)}\n'
        script += 'set ylabel "GB/s"\n'
        for c in clients:
            script += f'set title "{op}, {c} client(s): throughput by value size"\n'
            script += "plot " + ", ".join(
                f'"{op}-{c}-{t}.dat" using 1:2 with linespoints lw 2 title "{t}"' for t in TARGETS
                if data[f"{op}-{c}-{t}.dat"]) + "\n"
        script += "unset multiplot\n"
        gnuplot(script, data)
    # Latency: p50 (solid), p99 (dashed), p999 (dotted) per target, one client, put and get.
    c = clients[0]
    script = head + f'set output "{os.path.abspath(prefix)}-kv-latency.png"\nset multiplot layout 1,2\n'
    script += 'set logscale y\nset ylabel "µs per call"\nset key top left font ",8"\n'
    for op in ("put", "get"):
        script += f'set title "{op}, {c} client: latency p50 (solid), p99 (dashed), p999 (dotted)"\n'
        parts = []
        for i, t in enumerate(TARGETS, start=1):
            f = f"{op}-{c}-{t}.dat"
            if not data[f]:
                continue
            parts.append(f'"{f}" using 1:3 with linespoints lc {i} dt 1 lw 2 title "{t} p50"')
            parts.append(f'"{f}" using 1:4 with linespoints lc {i} dt 2 title "{t} p99"')
            parts.append(f'"{f}" using 1:5 with lines lc {i} dt 3 notitle')
        script += "plot " + ", ".join(parts) + "\n"
    script += "unset multiplot\n"
    gnuplot(script, data)
    return [f"{prefix}-kv-put.png", f"{prefix}-kv-get.png", f"{prefix}-kv-latency.png"]


def plot_master(s, prefix):
    ops = ["put", "get", "exist"]
    data = {f"{op}.dat": "".join(f"{r['threads']} {r['keys_per_s']} {r['p99_us']}\n"
                                  for r in s if r["op"] == op) for op in ops}
    script = ('set terminal pngcairo size 1200,450 font ",10"\nset grid\nset xtics 1\n'
              f'set output "{os.path.abspath(prefix)}-master.png"\nset multiplot layout 1,2\n'
              'set xlabel "clients"\nset key top left\n'
              'set title "metadata: keys/s, batches of 128 keys"\nset ylabel "keys/s"\nset yrange [0:*]\n'
              "plot " + ", ".join(f'"{op}.dat" using 1:2 with linespoints lw 2 title "{op}"' for op in ops) + "\n"
              'set title "metadata: p99 per batch"\nset ylabel "µs"\n'
              "plot " + ", ".join(f'"{op}.dat" using 1:3 with linespoints lw 2 title "{op}"' for op in ops) + "\n"
              "unset multiplot\n")
    gnuplot(script, data)
    return [f"{prefix}-master.png"]


def replace_blocks(doc_path, generated):
    with open(doc_path) as f:
        text = f.read()
    found = []
    for name, body in generated.items():
        pattern = re.compile(rf"(<!-- report:{re.escape(name)} -->\n)(?:.*?\n)?(<!-- /report:{re.escape(name)} -->)", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
            found.append(name)
    with open(doc_path, "w") as f:
        f.write(text)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="merged JSON written by bench/run.sh")
    parser.add_argument("--plots", metavar="PREFIX", help="write PREFIX-kv-*.png and PREFIX-master.png")
    parser.add_argument("--doc", help="rewrite the report:NAME blocks of this markdown file")
    args = parser.parse_args()
    with open(args.result) as f:
        doc = json.load(f)
    generated = blocks(doc, args.result)
    if args.plots:
        os.makedirs(os.path.dirname(args.plots) or ".", exist_ok=True)
        su = doc["suites"]
        written = []
        if not missing(su.get("kv", {"missing": True})):
            written += plot_kv(su["kv"], args.plots)
        if not missing(su.get("master", {"missing": True})):
            written += plot_master(su["master"], args.plots)
        print("plots: " + ", ".join(written), file=sys.stderr)
    if args.doc:
        # Suites left out with bench/run.sh --suites keep the doc's earlier tables.
        kept = {name for name, suite in doc["suites"].items()
                if isinstance(suite, dict) and str(suite.get("skipped", "")).startswith("not asked for")}
        generated = {name: body for name, body in generated.items()
                     if name not in kept and name.split("-")[0] not in kept}
        found = replace_blocks(args.doc, generated)
        print(f"{args.doc}: rewrote blocks {', '.join(found) or '(none found)'}", file=sys.stderr)
    else:
        for name, body in generated.items():
            print(f"### {name}\n\n{body}\n")


if __name__ == "__main__":
    main()
