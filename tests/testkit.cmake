# The test kit: random inputs, score modifiers, the float64 host reference, the forward and backward checks
# and the named-case runner, used by the CTest suite and by flashcl-probe's self-test. Included from the top
# level when either is built, so the tools have it with FLASHCL_BUILD_TESTS=OFF as well.
add_library(flashcl_testkit STATIC
  ${CMAKE_CURRENT_LIST_DIR}/test_util.c ${CMAKE_CURRENT_LIST_DIR}/test_mods.c
  ${CMAKE_CURRENT_LIST_DIR}/host_reference.c ${CMAKE_CURRENT_LIST_DIR}/forward_check.c
  ${CMAKE_CURRENT_LIST_DIR}/backward_check.c ${CMAKE_CURRENT_LIST_DIR}/test_cases.c
  ${CMAKE_CURRENT_LIST_DIR}/sequence_inputs.c)
flashcl_target_settings(flashcl_testkit)
target_include_directories(flashcl_testkit PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(flashcl_testkit PUBLIC flashcl_static Threads::Threads m)
# Case tables list the leading fields of a case and leave the rest (score modifiers) zero.
target_compile_options(flashcl_testkit PUBLIC $<$<C_COMPILER_ID:GNU,Clang>:-Wno-missing-field-initializers>)
