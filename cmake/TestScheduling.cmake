# How many of the machine's cores each ctest entry keeps busy (PROCESSORS), so that `ctest -j N` (tests/run.sh runs
# -j 2 by default, GMOD_TEST_JOBS to change it) never starts more work than there are cores: an entry that runs
# ranks under mpirun (label mpi) counts its ranks (2; 3 for the _np3 entries), a quick bench counts 2 (it times
# things and some run ranks), everything else one core. Entries that mostly wait count one: the multi-node drills
# (namespaced nodes waiting for each other or for a failure deadline) use 0.1-0.4 of a core, measured with
# /usr/bin/time (docs/engineering.md). An entry that sets PROCESSORS itself keeps it.
#
# Every CMakeLists.txt that adds tests calls gmod_schedule_tests() once: CMake 3.25 sets test properties only from
# the folder that added the test, so the pass runs deferred, at the end of that folder.
function(_gmod_schedule_this_dir)
  get_property(_tests DIRECTORY PROPERTY TESTS)
  foreach(_t IN LISTS _tests)
    get_test_property(${_t} PROCESSORS _p)
    if(_p)
      continue()
    endif()
    get_test_property(${_t} LABELS _labels)
    if("mpi" IN_LIST _labels OR "quick" IN_LIST _labels)
      set(_n 2)
      if(_t MATCHES "_np3($|\\.)")
        set(_n 3)
      endif()
      set_tests_properties(${_t} PROPERTIES PROCESSORS ${_n})
    endif()
  endforeach()
endfunction()

macro(gmod_schedule_tests)
  cmake_language(DEFER CALL _gmod_schedule_this_dir)
endmacro()
