# gmod_library(<name> SOURCES ... [DEPS ...]) -> static library gmod_<name>, alias gmod::<name>.
# gmod_test(<name> SOURCES ... [DEPS ...] [NP <ranks>] [LABELS ...] [SKIPPABLE Suite.Case ...]) -> GoogleTest
#   binary + ctest entries (gmod_gtest_entries below); with NP the test runs under mpirun with that many ranks.
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

# gmod_gtest_entries(<name> COMMAND cmd... [SKIPPABLE Suite.Case ...] [TIMEOUT s] [LABELS ...] [ENVIRONMENT ...])
#   -> the ctest entry <name> running every case but the SKIPPABLE ones, and one entry <name>.<Suite.Case> per
#   SKIPPABLE case. ctest counts an entry whose cases GTEST_SKIP as passed, so: a SKIPPABLE case (one that may
#   GTEST_SKIP: no CUDA device, too few ranks, a tool missing) runs alone and its entry is reported "Skipped" when it
#   skips; the main entry fails if any other case skips (register that case as SKIPPABLE).
function(gmod_gtest_entries name)
  cmake_parse_arguments(A "" "TIMEOUT" "COMMAND;SKIPPABLE;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  set(_filter)
  if(A_SKIPPABLE)
    list(JOIN A_SKIPPABLE ":" _s)
    set(_filter "--gtest_filter=-${_s}")
  endif()
  add_test(NAME ${name} COMMAND ${A_COMMAND} ${_filter})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${A_TIMEOUT} ENVIRONMENT "${A_ENVIRONMENT}" LABELS "${A_LABELS}"
                       FAIL_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  foreach(_c IN LISTS A_SKIPPABLE)
    add_test(NAME ${name}.${_c} COMMAND ${A_COMMAND} --gtest_filter=${_c})
    set_tests_properties(${name}.${_c} PROPERTIES TIMEOUT ${A_TIMEOUT} ENVIRONMENT "${A_ENVIRONMENT}"
                         LABELS "${A_LABELS}" SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endforeach()
endfunction()

function(gmod_test name)
  cmake_parse_arguments(A "" "NP;TIMEOUT" "SOURCES;DEPS;LABELS;SKIPPABLE" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_include_directories(${name} PRIVATE "${GMOD_ROOT}")
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main gmod_warnings)
  if(A_NP)
    set(_cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${A_NP} ${GMOD_MPIRUN_FLAGS} $<TARGET_FILE:${name}>)
  else()
    set(_cmd ${name})
  endif()
  # Where tests find the sources' fixtures; one thread per process (ctest runs entries side by side).
  gmod_gtest_entries(${name} COMMAND ${_cmd} SKIPPABLE ${A_SKIPPABLE} TIMEOUT ${A_TIMEOUT} LABELS ${A_LABELS}
                     ENVIRONMENT "GMOD_SOURCE_DIR=${GMOD_ROOT}" "OMP_NUM_THREADS=1")
endfunction()
