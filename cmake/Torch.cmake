# fp8kit._torch_ext: the pybind11 module under fp8kit.torch. Links against
# the installed torch's libraries directly (no Caffe2 CMake config), with
# torch's C++ ABI flag.
fp8kit_python_query(_fp8kit_torch_info
  "import torch, torch.utils.cpp_extension as c, os\nprint(','.join(c.include_paths()))\nprint(os.path.join(os.path.dirname(torch.__file__), 'lib'))\nprint(int(torch._C._GLIBCXX_USE_CXX11_ABI))\nprint(int(torch.version.cuda is not None))")
if(NOT _fp8kit_torch_info)
  message(FATAL_ERROR "fp8kit: building the PyTorch extension needs torch installed (or pass -DFP8KIT_TORCH=OFF)")
endif()
string(REPLACE "\n" ";" _fp8kit_torch_info "${_fp8kit_torch_info}")
list(GET _fp8kit_torch_info 0 _inc)
list(GET _fp8kit_torch_info 1 FP8KIT_TORCH_LIB_DIR)
list(GET _fp8kit_torch_info 2 FP8KIT_TORCH_CXX11_ABI)
list(GET _fp8kit_torch_info 3 FP8KIT_TORCH_HAS_CUDA)
string(REPLACE "," ";" FP8KIT_TORCH_INCLUDE_DIRS "${_inc}")

file(GLOB FP8KIT_TORCH_SRCS CONFIGURE_DEPENDS torch_ext/*.cc)
pybind11_add_module(_torch_ext MODULE ${FP8KIT_TORCH_SRCS})
target_include_directories(_torch_ext SYSTEM PRIVATE ${FP8KIT_TORCH_INCLUDE_DIRS})
target_include_directories(_torch_ext PRIVATE torch_ext)
# torch's and pybind11's headers dominate compile time: precompile them once,
# and compile the sources as unity files of nine (bazel/unity.bzl groups
# them alike), which also instantiates torch's templates once per group.
target_precompile_headers(_torch_ext PRIVATE torch_ext/torch_includes.h)
set_target_properties(_torch_ext PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 9)
target_compile_definitions(_torch_ext PRIVATE _GLIBCXX_USE_CXX11_ABI=${FP8KIT_TORCH_CXX11_ABI}
                                              TORCH_EXTENSION_NAME=_torch_ext)
set(_libs torch torch_cpu torch_python c10)
if(FP8KIT_WITH_CUDA AND FP8KIT_TORCH_HAS_CUDA)
  list(APPEND _libs torch_cuda c10_cuda)
  target_compile_definitions(_torch_ext PRIVATE FP8KIT_TORCH_CUDA)
  # Headers only: the module makes no CUDA runtime call of its own. What
  # c10's CUDA headers call inline resolves, at load time, to the runtime
  # that torch itself loads (a dependency of libc10_cuda); the core's is
  # inside libfp8kit.so.
  target_include_directories(_torch_ext SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
endif()
foreach(_l ${_libs})
  find_library(_p_${_l} ${_l} HINTS ${FP8KIT_TORCH_LIB_DIR} NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(_torch_ext PRIVATE ${_p_${_l}})
endforeach()
# The core is libfp8kit.so beside this module. torch's libraries are found
# at run time because `import torch` loads them first.
target_link_libraries(_torch_ext PRIVATE fp8kit)
set_target_properties(_torch_ext PROPERTIES INSTALL_RPATH "$ORIGIN")
install(TARGETS _torch_ext LIBRARY DESTINATION fp8kit)
