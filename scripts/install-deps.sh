#!/usr/bin/env bash
# Installs every Debian package Granary needs to build, test and benchmark. Idempotent: a machine
# that already has them all only pays for `apt-get update`.
set -euo pipefail

PACKAGES=(
  # build
  build-essential g++ cmake ninja-build pkg-config git
  # control plane
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # data plane, disk, keys, checksums
  libasio-dev liburing-dev libre2-dev libxxhash-dev
  # data-plane capabilities (HMAC-SHA256), TLS on the control plane; openssl makes the tests' CAs
  libssl-dev openssl
  # logging, CLI, config, HTTP, JSON
  libspdlog-dev libfmt-dev libcli11-dev libyaml-cpp-dev libcpp-httplib-dev nlohmann-json3-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev prometheus
  # python binding
  python3 python3-dev python3-pybind11 python3-numpy python3-pytest
  # real tensors in the Mooncake layer's tests (CPU torch; CUDA is found at run time, never built)
  python3-torch python3-venv
  # tests/deploy/check_deploy.py parses the Kubernetes YAML
  python3-yaml
  # HA coordination
  etcd-server etcd-client
  # comparison points
  redis-server redis-tools memcached libhiredis-dev
  # tools used by scripts
  curl procps iproute2 gnuplot-nox
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
