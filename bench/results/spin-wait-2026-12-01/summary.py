"""Prints the A/B of ab.sh: per run, 64 KiB get p50 and 4 MiB get GB/s, Granary TCP and memcached."""
import glob, json, os, re
here = os.path.dirname(os.path.abspath(__file__))
lim = json.load(open(os.path.join(here, "limits.json")))
print("limits:", {k: round(v, 2) if isinstance(v, float) else v for k, v in lim.items()
                  if k in ("memcpy_4096KiB", "tcp_1_streams", "tcp_rtt_64B_p50_us", "unix_rtt_64B_p50_us")})
for f in sorted(glob.glob(os.path.join(here, "kv-*.json"))):
    d = json.load(open(f))
    row = {}
    for r in d["results"]:
        if r["op"] != "get":
            continue
        k = (r["target"], r["size_text"])
        row[k] = r["p50_us"] if r["size_text"] == "64KiB" else r["gbps"]
    cells = [f"{t}/{s}: {v:.1f}" for (t, s), v in sorted(row.items())]
    print(os.path.basename(f)[3:-5].ljust(22), "  ".join(cells))
for f in sorted(glob.glob(os.path.join(here, "py-*.json"))):
    d = json.load(open(f))
    rows = d["rows"] if isinstance(d, dict) and "rows" in d else d
    out = []
    for r in rows:
        if r.get("api") in ("compat", "numpy", "memcached") and r.get("size") in (65536, 4194304):
            out.append(f"{r['api']}.{r['op']}/{r['size'] >> 10}K p50 {r['p50_us']:.0f}")
    print(os.path.basename(f)[3:-5].ljust(22), "  ".join(out))
