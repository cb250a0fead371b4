"""`pip install .` for the granary Python package: builds the C++ extension with CMake (reusing
build/, or $GRANARY_BUILD_DIR, so an already built tree only relinks) and installs it with the
pure-Python files under python/granary. Needs the packages of scripts/install-deps.sh; no
network. On Debian, install into a virtual environment (see docs/python.md)."""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("GRANARY_BUILD_DIR", os.path.join(HERE, "build"))
        configure = ["cmake", "-S", HERE, "-B", build_dir, "-G", "Ninja"]
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure.append("-DCMAKE_BUILD_TYPE=RelWithDebInfo")  # an existing tree keeps its own
        # A venv of Debian's python3 is the interpreter the tree is built for. Another CPython
        # gets its own module from the same tree (GRANARY_EXTRA_PYTHONS): only the binding
        # compiles again, against that interpreter's headers.
        python = os.path.realpath(sys.executable)
        target, out_dir = "_granary", os.path.join(build_dir, "python", "granary")
        if python != os.path.realpath("/usr/bin/python3"):
            tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
            configure.append(f"-DGRANARY_EXTRA_PYTHONS={sys.executable}")
            target, out_dir = f"_granary_{tag}", os.path.join(build_dir, f"python-{tag}", "granary")
        subprocess.check_call(configure)
        subprocess.check_call(["ninja", "-C", build_dir, "-j",
                               os.environ.get("GRANARY_JOBS", "2"), target])
        built = glob.glob(os.path.join(out_dir, "_granary*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one built _granary module, found {built}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built[0], target)


setup(
    name="granary",
    version="0.1.0",
    description="Python client for Granary, a distributed KV-cache store for LLM inference",
    packages=["granary", "granary.compat"],
    package_dir={"": "python"},
    ext_modules=[CMakeExtension("granary._granary")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    zip_safe=False,
)
