#!/usr/bin/env bash
# Installs what rankscope needs from Debian's packages, and nothing else.
# Idempotent: packages already present are not touched and `apt-get update`
# runs at most once per invocation, only when something is missing.
#
#   scripts/install-deps.sh build     # compilers and libraries for the build
#   scripts/install-deps.sh test      # + what the tests start: iproute2, stress-ng, faketime, promtool, Alertmanager,
#                                     #   a single-node Slurm (slurmctld, slurmd, srun) and munge; and, from npm,
#                                     #   the MCP client SDK the MCP test drives `rankscope mcp` with
set -euo pipefail

build_pkgs=(
  cmake make g++ pkg-config clang llvm
  libclang-rt-14-dev                    # libFuzzer and the sanitizers' runtimes (tests/fuzz)
  libbpf-dev bpftool libelf-dev zlib1g-dev
  libzmq3-dev cppzmq-dev libsodium-dev
  libzstd-dev                           # batches compressed on the wire (proto/compress.h)
  capnproto libcapnp-dev
  librocksdb-dev
  libboost-program-options-dev
  nlohmann-json3-dev                    # JSON-RPC in `rankscope mcp`
  libcurl4-openssl-dev                  # HTTP(S) to Alertmanager and etcd
  prometheus-cpp-dev
  libgtest-dev libgmock-dev
)
# slurm-wlm pulls slurmctld, slurmd and slurm-client (srun, sinfo, squeue); the
# tests start their own munged/slurmctld/slurmd, never the system services.
# systemd: systemd-analyze verifies the shipped units (tests/deploy).
# etcd-server: the fleet tests start their own etcd cluster on loopback (tests/e2e/fleet_test.cpp).
# python3, python3-yaml: the checks of the Grafana dashboard, the Kubernetes
# manifests and Perfetto exports; openssl and python3-bcrypt: a certificate
# and a password hash for an Alertmanager behind TLS and basic auth (kubectl, for `kubectl kustomize`, comes
# with this machine's image, not from Debian).
test_pkgs=(iproute2 stress-ng faketime procps prometheus prometheus-alertmanager slurm-wlm munge systemd etcd-server python3
  python3-yaml openssl python3-bcrypt)

want=("${build_pkgs[@]}")
case "${1:-build}" in
  build) ;;
  test|demo) want+=("${test_pkgs[@]}") ;;
  *) echo "usage: $0 build|test|demo" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# Node and npm run the official MCP client SDK (tests/mcp): this machine's
# own where it has them, else Debian's.
if [ "${1:-build}" != build ] && ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "rankscope: these Debian packages are missing: ${missing[*]}" >&2
    echo "rankscope: run this script as root (or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "rankscope: installing from Debian: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The npm packages of the tests that need a real third-party client: the
# MCP client SDK, at the version tests/mcp/package-lock.json pins.
if [ "${1:-build}" = test ]; then
  mcp="$(cd "$(dirname "$0")/.." && pwd)/tests/mcp"
  if ! cmp -s "$mcp/package-lock.json" "$mcp/node_modules/.rankscope-installed-lock" 2>/dev/null; then
    echo "rankscope: installing the MCP client SDK for the tests (npm ci in tests/mcp)"
    (cd "$mcp" && npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.rankscope-installed-lock)
  fi
fi
