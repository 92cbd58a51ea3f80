# The shared library exports exactly the functions the public header declares: a missing FCL_API or a
# leaked internal symbol fails. Run as
#   cmake -DNM=nm -DLIBRARY=libflashcl.so -DHEADER=include/flashcl.h -P exports.cmake
foreach(var NM LIBRARY HEADER)
  if(NOT ${var})
    message(FATAL_ERROR "exports.cmake: -D${var}= is required")
  endif()
endforeach()

execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY}
                OUTPUT_VARIABLE nm_out ERROR_VARIABLE nm_err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed (${rc}): ${nm_err}")
endif()
string(REGEX MATCHALL "[^\n]+" lines "${nm_out}")
set(exported "")
foreach(line IN LISTS lines)
  # "address type name[@version]"; the markers some linkers define are not the library's.
  string(REGEX REPLACE "^.* " "" name "${line}")
  string(REGEX REPLACE "@.*" "" name "${name}")
  if(NOT name MATCHES "^(_init|_fini|_edata|_end|__bss_start)$")
    list(APPEND exported ${name})
  endif()
endforeach()

# Comments name functions too ("fcl_last_error()"), so they go before looking for declarations.
file(READ ${HEADER} header)
string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" code "${header}")
string(REGEX REPLACE "//[^\n]*" "" code "${code}")
string(REGEX MATCHALL "fcl_[a-z0-9_]+[ \t\n]*\\(" calls "${code}")
set(declared "")
foreach(call IN LISTS calls)
  string(REGEX REPLACE "[ \t\n]*\\($" "" name "${call}")
  list(APPEND declared ${name})
endforeach()
if(NOT declared)
  message(FATAL_ERROR "no fcl_ function declarations found in ${HEADER}")
endif()

list(REMOVE_DUPLICATES exported)
list(REMOVE_DUPLICATES declared)
list(SORT exported)
list(SORT declared)
set(leaked ${exported})
list(REMOVE_ITEM leaked ${declared})
set(missing ${declared})
list(REMOVE_ITEM missing ${exported})
list(LENGTH declared count)
if(leaked OR missing)
  string(REPLACE ";" " " leaked "${leaked}")
  string(REPLACE ";" " " missing "${missing}")
  message(FATAL_ERROR "${LIBRARY} does not export exactly the ${count} functions of ${HEADER}\n"
                      "  exported but not declared (internal, or a missing static): ${leaked}\n"
                      "  declared but not exported (missing FCL_API?): ${missing}")
endif()
message(STATUS "${LIBRARY} exports exactly the ${count} functions of ${HEADER}")
