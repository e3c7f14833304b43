# gmod_library(<name> SOURCES ... [DEPS ...]) -> static library gmod_<name>, alias gmod::<name>.
# gmod_test(<name> SOURCES ... [DEPS ...] [NP <ranks>] [LABELS ...] [SKIPPABLE Suite.Case ...] [LOWER_ISA filter])
#   -> GoogleTest binary + ctest entries (gmod_gtest_entries below); with NP the test runs under mpirun with that
#   many ranks; with LOWER_ISA the cases matching the filter run a second time under AVX2 (gmod_lower_isa_entry).
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
# gmod_lower_isa_entry(<name> COMMAND cmd... [TIMEOUT s] [LABELS ...] [ENVIRONMENT ...]) -> the ctest entry
#   <name>.lower_isa running cmd under tests/lower_isa.sh (oneDNN and ATen capped at AVX2), label lower_isa; it is
#   reported "Skipped" on a CPU without AVX-512 (exit 77: its own set is the lower one). For the entries whose
#   figures depend on the CPU's kernels: parity against references computed elsewhere, measured memory peaks,
#   oracles with a stated tolerance (docs/engineering.md).
function(gmod_lower_isa_entry name)
  cmake_parse_arguments(A "" "TIMEOUT" "COMMAND;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  set(_labels lower_isa ${A_LABELS})
  add_test(NAME ${name}.lower_isa COMMAND sh ${GMOD_ROOT}/tests/lower_isa.sh ${A_COMMAND})
  set_tests_properties(${name}.lower_isa PROPERTIES TIMEOUT ${A_TIMEOUT} ENVIRONMENT "${A_ENVIRONMENT}"
                       LABELS "${_labels}" SKIP_RETURN_CODE 77 FAIL_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endfunction()

# gmod_gtest_entries(... [LOWER_ISA filter]): with LOWER_ISA, also the entry <name>.lower_isa running the cases
#   that match the GoogleTest filter under the lower instruction set (gmod_lower_isa_entry).
function(gmod_gtest_entries name)
  cmake_parse_arguments(A "" "TIMEOUT;LOWER_ISA" "COMMAND;SKIPPABLE;LABELS;ENVIRONMENT" ${ARGN})
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
  if(A_LOWER_ISA)
    gmod_lower_isa_entry(${name} COMMAND ${A_COMMAND} --gtest_filter=${A_LOWER_ISA} TIMEOUT ${A_TIMEOUT}
                         LABELS ${A_LABELS} ENVIRONMENT ${A_ENVIRONMENT})
  endif()
endfunction()

function(gmod_test name)
  cmake_parse_arguments(A "" "NP;TIMEOUT;LOWER_ISA" "SOURCES;DEPS;LABELS;SKIPPABLE" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_include_directories(${name} PRIVATE "${GMOD_ROOT}")
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main gmod_warnings)
  if(A_NP)
    set(_cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${A_NP} ${GMOD_MPIRUN_FLAGS} $<TARGET_FILE:${name}>)
  else()
    set(_cmd $<TARGET_FILE:${name}>)
  endif()
  # Where tests find the sources' fixtures; one thread per process (ctest runs entries side by side).
  gmod_gtest_entries(${name} COMMAND ${_cmd} SKIPPABLE ${A_SKIPPABLE} TIMEOUT ${A_TIMEOUT} LABELS ${A_LABELS}
                     LOWER_ISA ${A_LOWER_ISA} ENVIRONMENT "GMOD_SOURCE_DIR=${GMOD_ROOT}" "OMP_NUM_THREADS=1")
endfunction()
