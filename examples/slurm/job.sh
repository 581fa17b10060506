#!/bin/bash
# A Slurm job that asks hpc-ds1 how to run, runs that way, and tells hpc-ds1 how long it took.
#
#   sbatch examples/slurm/job.sh                      # gemm 2048 (the defaults below)
#   WORKLOAD=stencil SIZE=512 sbatch examples/slurm/job.sh
#   APP="./my_solver --n 4096" WORKLOAD=mysolver SIZE=4096 sbatch examples/slurm/job.sh
#
# 1. `hpc-ds1 recommend --format env` exports the configuration the model expects to be the
#    fastest for this workload and size on this node: HPC_DS1_RANKS, HPC_DS1_THREADS,
#    OMP_NUM_THREADS, HPC_DS1_TILE (and the mode, confidence, expected runtime, model version).
# 2. `srun` starts that many ranks with that many CPUs each, inside this allocation (a whole
#    node, so any configuration of it fits). `--mpi=pmi2`: MPI inside the ranks (the pip MPICH
#    wheel and MPICH-based site MPIs) gets its PMI from Slurm.
# 3. The measured wall time goes back with `hpc-ds1 observe`, so the next training learns from
#    this production run (a failed run is recorded as failed).
# See docs/slurm.md. Settings (the home, a server) come from the environment, as for any
# hpc-ds1 command: sbatch passes the submitting shell's environment on by default.
#SBATCH --job-name=hpc-ds1-job
#SBATCH --nodes=1
#SBATCH --exclusive
#SBATCH --time=00:30:00
set -euo pipefail

WORKLOAD=${WORKLOAD:-gemm}
SIZE=${SIZE:-2048}
HPC_DS1=${HPC_DS1:-hpc-ds1}
PYTHON=${PYTHON:-python3}

eval "$("$HPC_DS1" recommend --workload "$WORKLOAD" --size "$SIZE" --format env)"
echo "hpc-ds1 recommends for $WORKLOAD $SIZE: ranks=$HPC_DS1_RANKS threads=$HPC_DS1_THREADS" \
  "tile=$HPC_DS1_TILE (mode $HPC_DS1_MODE, confidence $HPC_DS1_CONFIDENCE," \
  "expected ${HPC_DS1_EXPECTED_RUNTIME_S} s, model $HPC_DS1_MODEL_VERSION)"

# The application. By default the built-in workload's own rank program (one timed run after
# one warm-up); your own program goes in APP and reads the exported variables it needs.
if [ -z "${APP:-}" ]; then
  gpu=$([ "${HPC_DS1_GPU:-0}" = 1 ] && echo 1 || echo 0)
  APP="$PYTHON -m hpc_ds1.runner.rank --job workload=$WORKLOAD,size=$SIZE,threads=$HPC_DS1_THREADS,tile=$HPC_DS1_TILE,repeats=1,gpu=$gpu"
fi

# More ranks x threads than the node's CPUs (an oversubscribed configuration can be the fastest
# for a memory-bound job) needs --overcommit, or the step is refused ("More processors
# requested than permitted").
step=(-n "$HPC_DS1_RANKS" --cpus-per-task "$HPC_DS1_THREADS" --mpi=pmi2)
[ $((HPC_DS1_RANKS * HPC_DS1_THREADS)) -le "${SLURM_CPUS_ON_NODE:-1}" ] || step+=(--overcommit)

started=$EPOCHREALTIME
status=0
# shellcheck disable=SC2086  # APP is a command line: split it into words
srun "${step[@]}" $APP || status=$?
ended=$EPOCHREALTIME
runtime=$(awk -v a="$started" -v b="$ended" 'BEGIN { printf "%.6f", b - a }')
echo "ran in $runtime s (exit $status)"

how=()
[ "$status" -eq 0 ] || how+=(--failed)
[ "${HPC_DS1_GPU:-0}" != 1 ] || how+=(--gpu)
"$HPC_DS1" observe --workload "$WORKLOAD" --size "$SIZE" --ranks "$HPC_DS1_RANKS" \
  --threads "$HPC_DS1_THREADS" --tile "$HPC_DS1_TILE" --runtime-s "$runtime" "${how[@]}"
exit "$status"
