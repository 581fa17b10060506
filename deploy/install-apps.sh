#!/usr/bin/env bash
# The real applications of examples/workloads/ for the tests in tests/apps/: Debian's hpcc
# (HPC Challenge), which brings Debian's Open MPI and its own mpirun (our MPI stays the pip
# MPICH; a workload with launcher = "openmpi" is started by Open MPI's mpirun: docs/plugins.md).
# Idempotent and quiet when they are already there. Not root, or no apt: says so, prints
# "skipped" and exits 0; the application tests then skip with that reason.
set -euo pipefail
PACKAGES=(hpcc)
BINARIES=(hpcc mpirun.openmpi)
missing() {
  local b
  for b in "${BINARIES[@]}"; do
    command -v "$b" >/dev/null 2>&1 || return 0
  done
  return 1
}
if ! missing; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "install-apps: skipped: ${BINARIES[*]} missing and this is not root: the application tests will skip (as root: apt-get install ${PACKAGES[*]})" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-apps: skipped: ${BINARIES[*]} missing and there is no apt-get: the application tests will skip" >&2
  exit 0
fi
echo "install-apps: installing Debian's ${PACKAGES[*]} for the application tests (apt)"
export DEBIAN_FRONTEND=noninteractive
# Another apt run (a second helper, unattended upgrades) holds the lock for a while: wait for it.
install() { apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null; }
if ! install && ! { apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null && install; }; then
  echo "install-apps: skipped: apt-get install ${PACKAGES[*]} failed: the application tests will skip" >&2
  exit 0
fi
if missing; then
  echo "install-apps: installed, but some of ${BINARIES[*]} are still not found: the application tests will skip" >&2
fi
