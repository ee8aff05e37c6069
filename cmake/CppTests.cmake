# GoogleTest tests of the core's C API. Debian's libgtest-dev where it is
# installed; elsewhere (the GPU machine has no package index) Debian's
# googletest source tree, carried along and built here, given as
# -DFP8KIT_GTEST_SOURCE_DIR=<copy of /usr/src/googletest>.
set(FP8KIT_GTEST_SOURCE_DIR "" CACHE PATH "googletest source tree to build when no installed GTest is found")
find_package(GTest QUIET)
if(NOT GTest_FOUND)
  if(NOT FP8KIT_GTEST_SOURCE_DIR)
    message(FATAL_ERROR "fp8kit: C++ tests need GoogleTest: apt-get install libgtest-dev, "
                        "or pass -DFP8KIT_GTEST_SOURCE_DIR=<googletest source>")
  endif()
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  add_subdirectory(${FP8KIT_GTEST_SOURCE_DIR} googletest EXCLUDE_FROM_ALL)
  if(NOT TARGET GTest::gtest_main)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
endif()
file(GLOB FP8KIT_CPP_TEST_SRCS CONFIGURE_DEPENDS tests/cpp/*_test.cc)
# Test-only CUDA code (the FP8 conversion self-test kernel): compiled into
# the test, never into the shipped libfp8kit.so.
file(GLOB FP8KIT_CPP_TEST_CUDA_SRCS CONFIGURE_DEPENDS tests/cpp/*.cu)
# The core's objects are linked in directly: the tests reach internals
# that libfp8kit.so does not export.
add_executable(fp8kit_core_test ${FP8KIT_CPP_TEST_SRCS})
target_include_directories(fp8kit_core_test PRIVATE common/src tests/cpp)
target_link_libraries(fp8kit_core_test PRIVATE fp8kit_core GTest::gtest_main)
if(FP8KIT_WITH_CUDA)
  target_sources(fp8kit_core_test PRIVATE ${FP8KIT_CPP_TEST_CUDA_SRCS})
  set_target_properties(fp8kit_core_test PROPERTIES CUDA_ARCHITECTURES "${FP8KIT_CUDA_ARCHITECTURES}")
  target_compile_options(fp8kit_core_test PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  # White-box GPU tests read the core's CUDA internals (the plan cache, the
  # conversion); all allocate device memory with the CUDA runtime directly.
  target_include_directories(fp8kit_core_test PRIVATE common/cuda ${FP8KIT_CUBLASLT_INCLUDE_DIR})
  target_link_libraries(fp8kit_core_test PRIVATE CUDA::cudart)
endif()
