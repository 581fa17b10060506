#!/bin/bash
# The body of a job whose header is `hpc-ds1 recommend --format slurm` (submit.sh writes the
# two together): the #SBATCH lines ask for the recommended ranks (--ntasks) and threads
# (--cpus-per-task); this runs the workload in that configuration, its own knobs as
# recommended, as a job step of the allocation, and records the run with `hpc-ds1 observe`.
#
#   WORKLOAD=hpcc SIZE=1000 examples/slurm/submit.sh      # see submit.sh
#
# `hpc-ds1 run --launcher srun` starts the ranks with srun: a workload file's with launcher
# "mpi" (and the built-ins) with --mpi=pmi2 (our MPICH), one with launcher "openmpi" (hpcc,
# built against Debian's Open MPI) with --mpi=pmix (Slurm's mpi/pmix plugin: Debian's
# libpmix-dev). The runtime recorded is the workload's own (hpcc: HPL's time), as setup
# measures it. See docs/slurm.md, "A real application as a job step".
set -euo pipefail
: "${WORKLOAD:?set WORKLOAD, the workload to run}" "${SIZE:?set SIZE, its problem size}"
HPC_DS1=${HPC_DS1:-hpc-ds1}
PYTHON=${PYTHON:-python3}

# The knobs of the workload's own, as the model recommends them (HPC_DS1_KNOB_NB=64, ...).
eval "$("$HPC_DS1" recommend --workload "$WORKLOAD" --size "$SIZE" --format env)"
ranks=${SLURM_NTASKS:-$HPC_DS1_RANKS}            # what the header asked for
threads=${SLURM_CPUS_PER_TASK:-$HPC_DS1_THREADS}
knobs=()
for var in ${!HPC_DS1_KNOB_@}; do
  name=${var#HPC_DS1_KNOB_}
  knobs+=(--knob "${name,,}=${!var}")
done
echo "hpc-ds1 recommends for $WORKLOAD $SIZE: ranks=$ranks threads=$threads ${knobs[*]}" \
  "(mode $HPC_DS1_MODE, confidence $HPC_DS1_CONFIDENCE, expected" \
  "${HPC_DS1_EXPECTED_RUNTIME_S} s, model $HPC_DS1_MODEL_VERSION)"

status=0
result=$("$HPC_DS1" run --workload "$WORKLOAD" --size "$SIZE" --ranks "$ranks" \
  --threads "$threads" "${knobs[@]}" --repeats 1 --launcher srun --json) || status=$?
# The run's own runtime (its [runtime], e.g. HPL's), its status and the step's command line.
runtime=0 ok=failed command="(did not run)"
read -r runtime ok command < <(printf '%s' "$result" | "$PYTHON" -c '
import json, sys
r = json.load(sys.stdin)
print(r["runtime_s"] or 0, r["status"], r["command"].replace("\n", " "))' 2>/dev/null) || true
echo "ran $command: $ok in $runtime s (exit $status)"

how=()
[ "$ok" = ok ] || how+=(--failed)
[ "$ok" = ok ] || runtime=1  # a failed run has no runtime of its own: recorded as failed
"$HPC_DS1" observe --workload "$WORKLOAD" --size "$SIZE" --ranks "$ranks" \
  --threads "$threads" "${knobs[@]}" --runtime-s "$runtime" "${how[@]}"
exit "$status"
