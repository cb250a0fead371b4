"""Smoke test of bench/engine_kv.py, the engine-shaped KV benchmark: its --quick run against a
standalone node it starts itself stores and loads a tiny Llama-shaped cache through the Mooncake
layer, verifies every byte, and writes the JSON that bench/gpu/run.sh collects. Without
--device cuda the GPU paths are reported as not run (on any machine)."""

import json
import os
import subprocess
import sys

from conftest import BIN_DIR, REPO

SCRIPT = os.path.join(REPO, "bench", "engine_kv.py")


def test_engine_kv_quick(tmp_path):
    out = tmp_path / "engine_kv.json"
    env = dict(os.environ, GRANARY_BIN_DIR=BIN_DIR)
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--standalone", "--json",
                           str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    doc = json.loads(out.read_text())
    assert doc["suite"] == "engine_kv" and doc["complete"] and doc["ok"]

    params = doc["params"]  # --quick: 2 layers x 4 pages of 2 x 2 heads x 64 tokens x 64 x bf16
    assert params["layout"] == "per-layer-page"
    assert params["objects"] == 8 and params["object_bytes"] == 2 * 2 * 64 * 64 * 2
    assert params["total_bytes"] == 8 * params["object_bytes"]

    limits = doc["limits"]
    assert limits["memcpy_torch_gbps"] > 0 and limits["memcpy_numpy_gbps"] > 0
    assert limits["h2d_gbps"] is None and limits["d2h_gbps"] is None

    host = doc["host"]
    assert host["available"] and host["verified"] is True
    assert host["store_gbps"] > 0 and host["load_gbps"] > 0
    assert host["store_vs_memcpy"] > 0 and host["load_vs_memcpy"] > 0
    assert len(host["store_ms"]) == len(host["load_ms"]) == params["repeats"] == 1

    gpu = doc["gpu"]
    assert gpu["available"] is False and gpu["reason"]
    assert gpu["staged"] is None and gpu["direct"] is None
    assert doc["model_check"] is None
    assert "store GB/s" in proc.stdout and "verified" in proc.stdout
