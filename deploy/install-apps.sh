#!/usr/bin/env bash
# The real applications of examples/workloads/ for the tests in tests/apps/: Debian's hpcc
# (HPC Challenge) and nwchem (NWChem: 19 MB to download, the smallest of the chemistry codes
# Debian ships: quantum-espresso 48 MB, cp2k with its data 42 MB). Both bring Debian's Open MPI
# and its own mpirun (our MPI stays the pip MPICH; a workload with launcher = "openmpi" is
# started by Open MPI's mpirun: docs/plugins.md). And libpmix-dev, whose libpmix.so Slurm's
# mpi/pmix plugin loads to start an Open MPI application as a job step (`srun --mpi=pmix`:
# docs/slurm.md, tests/slurm/test_hpcc_step.py).
# Idempotent and quiet when they are already there. Not root, or no apt: says so, prints
# "skipped" and exits 0; the application tests then skip with that reason.
set -euo pipefail
PACKAGES=(hpcc nwchem libpmix-dev)
BINARIES=(hpcc nwchem mpirun.openmpi)
FILES=("/usr/lib/*/pmix2/lib/libpmix.so")  # patterns: the multiarch folder varies
missing() {
  local b f
  for b in "${BINARIES[@]}"; do
    command -v "$b" >/dev/null 2>&1 || return 0
  done
  for f in "${FILES[@]}"; do
    compgen -G "$f" >/dev/null || return 0
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
