"""`pip install .` from the source tree, with no network, into a fresh virtual environment: the
installed package imports from outside the tree and talks to a real store."""

import os
import subprocess
import sys

from conftest import BIN_DIR, REPO


def test_pip_install_into_a_venv(tmp_path, standalone):
    venv = tmp_path / "venv"
    subprocess.check_call(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)])
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the installed copy, not the build tree's
    env["GRANARY_BUILD_DIR"] = os.path.dirname(BIN_DIR)  # reuse the built tree: only relinks
    env["PIP_NO_INDEX"] = "1"
    result = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-cache-dir", REPO],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    script = ("import granary, granary.compat.mooncake as m, sys\n"
              "assert granary.__file__.startswith(sys.prefix), granary.__file__\n"
              "with granary.Store(sys.argv[1]) as s:\n"
              "    s.put('pip/k', b'installed')\n"
              "    assert s.get('pip/k') == b'installed'\n"
              "st = m.MooncakeDistributedStore()\n"
              "assert st.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 0, 'tcp', '', sys.argv[1]) == 0\n"
              "assert st.get('pip/k') == b'installed' and st.close() == 0\n"
              "print('ok')\n")
    run = subprocess.run([str(venv / "bin" / "python"), "-c", script, standalone.master],
                         env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
