# Precompiled LibTorch headers: two artifacts per build, reused by every target that links LibTorch.
#
# gmod_pch (a static library with one empty source) compiles cmake/gmod_pch.h once, gmod_pch_test compiles
# cmake/gmod_pch_test.h (the same plus GoogleTest and <torch/torch.h>) once; gmod_precompile_all(), called at the end
# of the top-level CMakeLists.txt, makes every C++ library, executable and benchmark defined by then reuse the first
# and every target that links GoogleTest the second (target_precompile_headers REUSE_FROM), so a new target gets
# one without asking. GCC accepts a precompiled header only where the compiler options that shape it match (-O, -g,
# -std, the macros the headers read, e.g. GMOD_WITH_CUDA), and all gmod targets that link LibTorch share them;
# -Winvalid-pch (CMake adds it) reports a rejected one. Targets without LibTorch (eval/ and its tests) get none; a
# target that must not use it sets the property GMOD_NO_PCH. Configure with -DGMOD_PCH=OFF to build without (e.g. to time it).
#
# ccache caches both the header's compilation and its users' when its sloppiness allows precompiled headers;
# GMOD_CCACHE_ENV carries those settings into the compiler launcher (CMakeLists.txt), so builds started with a
# plain `cmake --build` hit the cache as launch/build.sh's do.
include_guard(GLOBAL)

option(GMOD_PCH "Precompile the LibTorch headers once and reuse them in every target" ON)
set(GMOD_CCACHE_ENV "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
    "CCACHE_INODECACHE=true")

function(gmod_pch_target)
  if(NOT GMOD_PCH)
    return()
  endif()
  add_library(gmod_pch STATIC "${CMAKE_CURRENT_SOURCE_DIR}/cmake/gmod_pch.cpp")
  target_link_libraries(gmod_pch PRIVATE gmod::torch)
  target_precompile_headers(gmod_pch PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}/cmake/gmod_pch.h")
  if(GMOD_BUILD_TESTS)
    add_library(gmod_pch_test STATIC "${CMAKE_CURRENT_SOURCE_DIR}/cmake/gmod_pch.cpp")
    target_include_directories(gmod_pch_test PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}")
    target_link_libraries(gmod_pch_test PRIVATE gmod::torch GTest::gtest)
    target_precompile_headers(gmod_pch_test PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}/cmake/gmod_pch_test.h")
  endif()
endfunction()

# Every target of `dir` and its subdirectories, recursively.
function(_gmod_targets_below dir out)
  get_property(_t DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(_subs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(_s IN LISTS _subs)
    _gmod_targets_below("${_s}" _below)
    list(APPEND _t ${_below})
  endforeach()
  set(${out} ${_t} PARENT_SCOPE)
endfunction()

# Whether target `t` links LibTorch (gmod_torch), directly or through the libraries it links, in `out`.
function(_gmod_links_torch t out)
  set(_seen)
  set(_todo ${t})
  while(_todo)
    list(POP_FRONT _todo _x)
    if(NOT TARGET ${_x} OR _x IN_LIST _seen)
      continue()
    endif()
    list(APPEND _seen ${_x})
    get_target_property(_real ${_x} ALIASED_TARGET)
    if(_real)
      set(_x ${_real})
    endif()
    if(_x STREQUAL "gmod_torch")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    get_target_property(_type ${_x} TYPE)
    set(_deps)
    if(NOT _type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(_deps ${_x} LINK_LIBRARIES)
    endif()
    get_target_property(_ideps ${_x} INTERFACE_LINK_LIBRARIES)
    foreach(_d IN LISTS _deps _ideps)
      if(_d AND TARGET ${_d})
        list(APPEND _todo ${_d})
      endif()
    endforeach()
  endwhile()
  set(${out} FALSE PARENT_SCOPE)
endfunction()

function(gmod_precompile_all)
  if(NOT GMOD_PCH)
    return()
  endif()
  _gmod_targets_below("${CMAKE_CURRENT_SOURCE_DIR}" _all)
  set(_n 0)
  foreach(_t IN LISTS _all)
    get_target_property(_type ${_t} TYPE)
    get_target_property(_skip ${_t} GMOD_NO_PCH)
    if(_t MATCHES "^gmod_pch" OR _skip OR NOT _type MATCHES "^(EXECUTABLE|STATIC_LIBRARY)$")
      continue()
    endif()
    _gmod_links_torch(${_t} _torch)
    if(NOT _torch)  # eval/ and its tests: no LibTorch, nothing to precompile
      continue()
    endif()
    get_target_property(_libs ${_t} LINK_LIBRARIES)
    if(TARGET gmod_pch_test AND "GTest::gtest" IN_LIST _libs)
      target_precompile_headers(${_t} REUSE_FROM gmod_pch_test)
    else()
      target_precompile_headers(${_t} REUSE_FROM gmod_pch)
    endif()
    math(EXPR _n "${_n} + 1")
  endforeach()
  message(STATUS "Precompiled LibTorch headers (cmake/gmod_pch*.h) reused by ${_n} targets")
endfunction()
