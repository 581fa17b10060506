#!/usr/bin/env bash
# A real single-node Slurm for the tests in tests/slurm/: Debian's slurmctld, slurmd,
# slurm-client and munge (the fixture writes its own slurm.conf and munge key in a temp
# dir and starts the daemons itself; the packages' own services are not used).
# Idempotent and quiet when they are already there. Not root, or no apt: says so, prints
# "skipped" and exits 0; the Slurm tests then skip with that reason.
set -euo pipefail
PACKAGES=(slurmctld slurmd slurm-client munge)
BINARIES=(slurmctld slurmd srun sbatch sinfo munged)
missing() {
  local b
  for b in "${BINARIES[@]}"; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || return 0
  done
  return 1
}
if ! missing; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "install-slurm: skipped: Slurm (${BINARIES[*]}) is missing and this is not root: the Slurm tests will skip (as root: apt-get install ${PACKAGES[*]})" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-slurm: skipped: Slurm is missing and there is no apt-get: the Slurm tests will skip" >&2
  exit 0
fi
echo "install-slurm: installing Debian's ${PACKAGES[*]} for the Slurm tests (apt)"
export DEBIAN_FRONTEND=noninteractive
# The packages' maintainer scripts try to start their services; there is no init here
# and the tests start their own daemons, so policy-rc.d tells invoke-rc.d not to.
POLICY=/usr/sbin/policy-rc.d
OWN_POLICY=0
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$POLICY"
  chmod +x "$POLICY"
  OWN_POLICY=1
fi
cleanup() { if [ "$OWN_POLICY" = 1 ]; then rm -f "$POLICY"; fi; }
trap cleanup EXIT
# Another apt run (a second helper, unattended upgrades) holds the lock for a while: wait for it.
install() { apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null; }
if ! install && ! { apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null && install; }; then
  echo "install-slurm: skipped: apt-get install ${PACKAGES[*]} failed: the Slurm tests will skip" >&2
  exit 0
fi
if missing; then
  echo "install-slurm: installed, but some of ${BINARIES[*]} are still not found: the Slurm tests will skip" >&2
fi
