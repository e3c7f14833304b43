# How much of the machine each ctest entry keeps busy (PROCESSORS), so that `ctest -j` never starts more work than
# there are cores. The unit is half a core (GMOD_TEST_SLOTS_PER_CORE slots per core): tests/run.sh runs
# `ctest -j 2N` on N cores (GMOD_TEST_JOBS, default 2). An entry under mpirun (label mpi) counts its ranks (2 cores;
# 3 for the _np3 entries, which ctest caps at the level), a quick bench 2 cores (it times things and some run ranks),
# an entry that sets PROCESSORS itself that many cores, everything else one core, and the entries that mostly wait
# half a core: the multi-node drills (label multinode; namespaced nodes waiting for each other or for a failure
# deadline) use 0.1-0.4 of a core, measured with /usr/bin/time (docs/engineering.md), so two of them run beside
# one ordinary entry.
#
# Every CMakeLists.txt that adds tests calls gmod_schedule_tests() once: CMake 3.25 sets test properties only from
# the folder that added the test, so the pass runs deferred, at the end of that folder.
set(GMOD_TEST_SLOTS_PER_CORE 2)

function(_gmod_schedule_this_dir)
  get_property(_tests DIRECTORY PROPERTY TESTS)
  foreach(_t IN LISTS _tests)
    get_test_property(${_t} PROCESSORS _cores)
    get_test_property(${_t} LABELS _labels)
    if(_cores)
      math(EXPR _slots "${_cores} * ${GMOD_TEST_SLOTS_PER_CORE}")
    elseif("mpi" IN_LIST _labels OR "quick" IN_LIST _labels)
      set(_slots 4)
      if(_t MATCHES "_np3($|\\.)")
        set(_slots 6)
      endif()
    elseif("multinode" IN_LIST _labels)
      set(_slots 1)
    else()
      set(_slots ${GMOD_TEST_SLOTS_PER_CORE})
    endif()
    set_tests_properties(${_t} PROPERTIES PROCESSORS ${_slots})
  endforeach()
endfunction()

macro(gmod_schedule_tests)
  cmake_language(DEFER CALL _gmod_schedule_this_dir)
endmacro()
