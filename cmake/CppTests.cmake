# GoogleTest tests of the core's C API (Debian's libgtest-dev).
find_package(GTest REQUIRED)
file(GLOB FP8KIT_CPP_TEST_SRCS CONFIGURE_DEPENDS tests/cpp/*_test.cc)
add_executable(fp8kit_core_test ${FP8KIT_CPP_TEST_SRCS})
target_include_directories(fp8kit_core_test PRIVATE common/src tests/cpp)
target_link_libraries(fp8kit_core_test PRIVATE fp8kit_core GTest::gtest_main)
