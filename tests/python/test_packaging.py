"""`pip install .` from the source tree, with no network, into a fresh virtual environment: the
installed package imports from outside the tree and talks to a real store."""

import glob
import os
import re
import subprocess
import sys

import pytest

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


def other_cpythons():
    """CPython 3.10-3.13 interpreters of another minor version than the build's, with headers
    and setuptools (pyenv's, on this image), newest first."""
    found = []
    for root in glob.glob("/root/.pyenv/versions/3.*/bin/python3.*"):
        m = re.search(r"python3\.(\d+)$", root)
        if not m or not 10 <= int(m.group(1)) <= 13 or int(m.group(1)) == sys.version_info[1]:
            continue
        probe = subprocess.run([root, "-c", "import setuptools, sysconfig, os; "
                                "print(os.path.exists(sysconfig.get_paths()['include'] + "
                                "'/Python.h'))"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            found.append((int(m.group(1)), root))
    return [root for _, root in sorted(found, reverse=True)]


def test_pip_install_into_a_venv_of_another_cpython(tmp_path, standalone):
    pythons = other_cpythons()
    if not pythons:
        pytest.skip("no other CPython with headers and setuptools on this host (pyenv's)")
    python = pythons[0]
    venv = tmp_path / "venv"
    subprocess.check_call([python, "-m", "venv", "--system-site-packages", str(venv)])
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["GRANARY_BUILD_DIR"] = os.path.dirname(BIN_DIR)  # only the binding compiles again
    env["PIP_NO_INDEX"] = "1"
    result = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-cache-dir",
                             "--no-build-isolation", REPO],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    script = ("import granary, granary.compat.mooncake as m, sys\n"
              "assert granary.__file__.startswith(sys.prefix), granary.__file__\n"
              "from granary import _granary\n"
              "assert _granary.__file__.endswith(sys.implementation.cache_tag.replace("
              "'cpython-', '.cpython-') + '-x86_64-linux-gnu.so'), _granary.__file__\n"
              "st = m.MooncakeDistributedStore()\n"
              "assert st.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 1 << 20, 'tcp', '', sys.argv[1]) == 0\n"
              "assert st.put('pip2/k', b'other python') == 0\n"
              "assert st.get('pip2/k') == b'other python' and st.close() == 0\n"
              "print(sys.version_info[:2])\n")
    run = subprocess.run([str(venv / "bin" / "python"), "-c", script, standalone.master],
                         env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() != str(sys.version_info[:2]), "ran under the build's own Python"
