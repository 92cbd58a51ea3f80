#!/bin/sh
# Runs a test under Oclgrind with data-race, uninitialised-value and API checks. Oclgrind reports
# invalid accesses to its log; any line there, or a failing test, fails the run.
set -u
oclgrind=$1
shift
log=$(mktemp)
# -cl-opt-disable: the uninitialised-value checker cannot follow the optimiser's freeze instruction.
# OCLGRIND_CHECKS replaces the checks (see tests/CMakeLists.txt for the one test that does).
# shellcheck disable=SC2086
"$oclgrind" ${OCLGRIND_CHECKS:---data-races --uninitialized --check-api} --build-options -cl-opt-disable --log "$log" "$@"
status=$?
if [ -s "$log" ]; then
  echo "Oclgrind reported:"
  cat "$log"
  status=1
fi
rm -f "$log"
exit $status
