# gmod_library(<name> SOURCES ... [DEPS ...]) -> static library gmod_<name>, alias gmod::<name>.
# gmod_test(<name> SOURCES ... [DEPS ...] [NP <ranks>] [LABELS ...]) -> GoogleTest binary + ctest entry;
#   with NP the test runs under mpirun with that many ranks.
include_guard(GLOBAL)

function(gmod_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  if(NOT A_SOURCES)  # folder not grown yet: header-only placeholder
    add_library(gmod_${name} INTERFACE)
    target_include_directories(gmod_${name} INTERFACE "${GMOD_ROOT}")
    target_link_libraries(gmod_${name} INTERFACE ${A_DEPS})
  else()
    add_library(gmod_${name} STATIC ${A_SOURCES})
    target_include_directories(gmod_${name} PUBLIC "${GMOD_ROOT}")
    target_link_libraries(gmod_${name} PUBLIC ${A_DEPS} PRIVATE gmod_warnings)
  endif()
  add_library(gmod::${name} ALIAS gmod_${name})
endfunction()

set(GMOD_MPIRUN_FLAGS --allow-run-as-root --oversubscribe --bind-to none
    --mca btl_vader_single_copy_mechanism none CACHE STRING "Extra mpirun flags for tests")

function(gmod_test name)
  cmake_parse_arguments(A "" "NP;TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_include_directories(${name} PRIVATE "${GMOD_ROOT}")
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main gmod_warnings)
  if(A_NP)
    add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${A_NP} ${GMOD_MPIRUN_FLAGS}
             $<TARGET_FILE:${name}>)
  else()
    add_test(NAME ${name} COMMAND ${name})
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${A_TIMEOUT}
    ENVIRONMENT "GMOD_SOURCE_DIR=${GMOD_ROOT};OMP_NUM_THREADS=1" LABELS "${A_LABELS}")
endfunction()
