# File: bench/common.sh — what the bench scripts that launch pdcoll-bench and
# mpi_allreduce_bench side by side share; sourced, not run.

# Open MPI as root in a container: allowed, and quiet about BTLs it skips.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0

# in_place_us: the in-place time (us) of each size row on stdin, the fourth
# field from the end, as both benchmarks print nccl-tests' columns
# (pdcoll-run prefixes "[0]").
in_place_us() { awk '$1 ~ /^[0-9]+$/ || ($1 == "[0]" && $2 ~ /^[0-9]+$/) { print $(NF - 3) }'; }
