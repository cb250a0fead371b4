#!/usr/bin/env bash
# bench/gpu/pack.sh - run on the build machine: gathers what bench/gpu/run.sh needs on a GPU
# machine into one folder, small enough to travel with the work tree (64 MiB), and prints the
# `carry` list to use.
#
#   bench/gpu/pack.sh            # -> build/gpu-pack/{bin,lib,python}
#
# bin/     granary-master, granary-node, granary-bench, granary: stripped copies of build/bin's
# lib/     every shared library `ldd` names for them and for the Python extension, except those
#          the GPU machine must supply itself: libc, libm, libpthread, libdl, librt, ld-linux
#          (glibc), libstdc++, libgcc_s, and CUDA's driver and runtime (the store finds
#          libcudart at run time: torch's, once torch has initialised CUDA)
# python/  the granary package built for the GPU machine's Python 3.12 (default
#          build/python-cp312/granary, from cmake -DGRANARY_EXTRA_PYTHONS=...python3.12, else
#          build/py312/granary: _granary.cpython-312-*.so, stripped, and its .py files)
#
# Environment: BUILD_DIR (default build), PY_PKG (the package folder to pack), PACK (default
# $BUILD_DIR/gpu-pack). Needs ldd, strip and objdump (binutils).
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD_DIR=${BUILD_DIR:-build}
if [[ -z ${PY_PKG:-} ]]; then
  PY_PKG=$BUILD_DIR/python-cp312/granary
  [[ -d $PY_PKG ]] || PY_PKG=$BUILD_DIR/py312/granary
fi
PACK=${PACK:-$BUILD_DIR/gpu-pack}
LIMIT_MIB=64

rm -rf "$PACK"
mkdir -p "$PACK/bin" "$PACK/lib" "$PACK/python"

packed=()
for b in granary-master granary-node granary-bench granary; do
  if [[ -x $BUILD_DIR/bin/$b ]]; then
    strip --strip-unneeded -o "$PACK/bin/$b" "$BUILD_DIR/bin/$b"
    packed+=("$PACK/bin/$b")
  elif [[ $b == granary-master || $b == granary-node ]]; then
    echo "pack.sh: $BUILD_DIR/bin/$b is missing: build first" >&2
    exit 1
  fi
done

py_note="no Python package"
if [[ -f $PY_PKG/__init__.py ]] && compgen -G "$PY_PKG/_granary.*.so" >/dev/null; then
  # The package's files, without caches; the extension stripped.
  (cd "$(dirname "$PY_PKG")" && find granary -name __pycache__ -prune -o -type f -print) |
    while read -r f; do
      mkdir -p "$PACK/python/$(dirname "$f")"
      case $f in
        *.so) strip --strip-unneeded -o "$PACK/python/$f" "$(dirname "$PY_PKG")/$f" ;;
        *) cp "$(dirname "$PY_PKG")/$f" "$PACK/python/$f" ;;
      esac
    done
  for so in "$PACK"/python/granary/_granary.*.so; do
    packed+=("$so")
    py_note="Python package with $(basename "$so")"
    case $so in
      *cpython-312-*) ;;
      *) echo "pack.sh: warning: $(basename "$so") is not for CPython 3.12, the GPU machine's" \
              "Python" >&2 ;;
    esac
  done
else
  echo "pack.sh: warning: no built package at $PY_PKG (its __init__.py and _granary.*.so):" \
       "run.sh's Python steps need the extension for the GPU machine's Python 3.12;" \
       "set PY_PKG to pack another" >&2
fi

# The libraries ldd resolves, by the name the binaries ask for; glibc, the C++ runtime and
# CUDA's own libraries are the GPU machine's.
skip='^(libc|libm|libpthread|libdl|librt|libutil|libresolv|libstdc\+\+|libgcc_s|libcuda|libcudart|libnvidia[^.]*)\.so|^ld-linux'
missing=$(ldd "${packed[@]}" 2>/dev/null | awk '/not found/{print $1}' | sort -u || true)
if [[ -n $missing ]]; then
  echo "pack.sh: ldd cannot resolve: $missing" >&2
  exit 1
fi
ldd "${packed[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    if [[ $name =~ $skip ]]; then continue; fi
    cp -L "$path" "$PACK/lib/$name"
  done

# What the GPU machine's glibc and libstdc++ must provide.
need() {
  objdump -T "${packed[@]}" "$PACK"/lib/* 2>/dev/null | grep -o "$1_[0-9][0-9.]*" |
    sort -uV | tail -1
}
kib=$(du -sk "$PACK" | cut -f1)
bins=$(find "$PACK/bin" -type f -printf '%f ')
libs=$(find "$PACK/lib" -type f | wc -l)
echo "packed $PACK: $bins| $libs libraries | $py_note; $((kib / 1024)) MiB"
echo "the GPU machine needs glibc $(need GLIBC) and libstdc++ $(need GLIBCXX) (or newer)"
if ((kib > LIMIT_MIB * 1024 - 4096)); then
  echo "pack.sh: warning: $((kib / 1024)) MiB is too close to the ${LIMIT_MIB} MiB that" \
       "travels with the work tree" >&2
fi
echo "carry: [\"$PACK\"]"
echo "run:   OUT=\$OUT bash bench/gpu/run.sh   (timeout_s 540)"
