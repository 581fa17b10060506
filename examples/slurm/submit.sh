#!/bin/bash
# Submit a job in the configuration hpc-ds1 recommends for it: the job script is
# `hpc-ds1 recommend --format slurm` (its #SBATCH lines: --ntasks, --cpus-per-task) followed
# by the body, app-job.sh by default, which runs the workload as a job step and records it.
#
#   WORKLOAD=hpcc SIZE=1000 examples/slurm/submit.sh [sbatch options ...]
#   WORKLOAD=hpcc SIZE=1000 BODY=my-body.sh examples/slurm/submit.sh -p debug
#
# Prints sbatch's answer (the job id). WORKLOAD, SIZE, HPC_DS1 and the home's settings reach
# the job through the environment, as sbatch passes it on by default.
set -euo pipefail
: "${WORKLOAD:?set WORKLOAD, the workload to run}" "${SIZE:?set SIZE, its problem size}"
HPC_DS1=${HPC_DS1:-hpc-ds1}
BODY=${BODY:-$(dirname "$(readlink -f "$0")")/app-job.sh}
script=$(mktemp --suffix=.sh "${TMPDIR:-/tmp}/hpc-ds1-job-XXXXXX")
trap 'rm -f "$script"' EXIT  # sbatch keeps its own copy of the script
{
  echo "#!/bin/bash"
  "$HPC_DS1" recommend --workload "$WORKLOAD" --size "$SIZE" --format slurm
  echo "#SBATCH --job-name=hpc-ds1-$WORKLOAD"
  tail -n +2 "$BODY"  # the body without its own #! line
} >"$script"
export WORKLOAD SIZE HPC_DS1
sbatch "$@" "$script"
