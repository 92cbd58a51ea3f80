# Run after each build of a table-driven test executable: writes `EXE ARGS --list` (one case name a line)
# to OUTPUT, which add_cases.cmake turns into CTest tests. A listing that fails (a duplicate or malformed
# name) fails the build.
# cmake -DEXE=<executable> -DARGS=<;-list> -DOUTPUT=<file> -P list_cases.cmake
execute_process(COMMAND ${EXE} ${ARGS} --list RESULT_VARIABLE rc OUTPUT_VARIABLE names ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR names STREQUAL "")
  message(FATAL_ERROR "${EXE} ${ARGS} --list failed (${rc}): ${err}")
endif()
file(WRITE ${OUTPUT}.tmp "${names}")
file(RENAME ${OUTPUT}.tmp ${OUTPUT})
