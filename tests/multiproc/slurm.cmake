# pdcoll started by a real srun (tests/slurm/run.sh): a private one-node
# Slurm cluster, pdcoll-bench's checked sweeps on 1-4 tasks with the
# rendezvous root taken from the job step (no PDCOLL_ROOT), two concurrent
# steps of one job, and a batch script's own process refused at once. Needs
# root and slurm-wlm's daemons (scripts/install-deps.sh --slurm), else skipped.
if(TARGET pdcoll-bench)
  add_test(NAME slurm.srun COMMAND ${PROJECT_SOURCE_DIR}/tests/slurm/run.sh $<TARGET_FILE:pdcoll-bench>)
  set_tests_properties(slurm.srun PROPERTIES LABELS "multiproc;slurm" TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()
