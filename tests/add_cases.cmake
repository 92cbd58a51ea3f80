# Included by CTest (TEST_INCLUDE_FILES) through the file flashcl_case_tests writes for a group: one test
# <group>/<case> per line of the group's case list, running `<launcher> <exe> <args> --case <case>` with
# the group's environment. Reading the list at test time rather than writing tests at build time keeps
# the environment and properties in step with the last configure.
# Set by the includer: group, names_file, launcher, exe, args, environment, properties (;-lists), sample
# (empty: every case in CI's cross-section; n > 0: every n-th; 0: none; the others are labelled `extended`),
# stride and offset (only cases offset, offset + stride, ... are registered; 1 and 0 register every case).
if(NOT EXISTS "${names_file}")
  # Not built yet: one test that fails and says so, rather than a suite that silently lacks these cases.
  add_test("${group}_NOT_BUILT" "${group}_NOT_BUILT")
  return()
endif()
file(STRINGS "${names_file}" names)
set(index 0)
foreach(name IN LISTS names)
  math(EXPR position "${index} - ${offset}")
  math(EXPR index "${index} + 1")
  math(EXPR remainder "${position} % ${stride}")
  if(position LESS 0 OR NOT remainder EQUAL 0)
    continue()
  endif()
  math(EXPR position "${position} / ${stride}") # the case's place among those registered, for SAMPLE
  add_test("${group}/${name}" ${launcher} "${exe}" ${args} --case "${name}")
  set_tests_properties("${group}/${name}" PROPERTIES ENVIRONMENT "${environment}" SKIP_RETURN_CODE 77 ${properties})
  if(NOT sample STREQUAL "")
    set(remainder 1)
    if(sample GREATER 0)
      math(EXPR remainder "${position} % ${sample}")
    endif()
    if(NOT remainder EQUAL 0)
      set_tests_properties("${group}/${name}" PROPERTIES LABELS extended)
    endif()
  endif()
endforeach()
