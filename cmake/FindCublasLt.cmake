# Finds the CUDA toolkit and cuBLASLt. cuBLASLt may come with the toolkit
# or from the nvidia-cublas pip wheel (its headers and library sit under
# site-packages/nvidia/cu*/ or nvidia/cublas/). Sets FP8KIT_CUDA_REASON to a
# one-line reason when CUDA cannot be built, else enables the CUDA language
# and sets FP8KIT_CUBLASLT_INCLUDE_DIR and FP8KIT_CUBLASLT_LIBRARY.
include(CheckLanguage)
set(FP8KIT_CUDA_REASON "")
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  set(FP8KIT_CUDA_REASON "no CUDA compiler (nvcc) found")
  return()
endif()
set(CMAKE_CUDA_STANDARD 17)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

fp8kit_python_query(_fp8kit_wheel_dirs
  "import importlib.util as u, pathlib as p\ns=u.find_spec('nvidia')\nprint(';'.join(str(x) for x in p.Path(list(s.submodule_search_locations)[0]).glob('*') if x.is_dir()) if s else '')")

find_path(FP8KIT_CUBLASLT_INCLUDE_DIR cublasLt.h
          HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_fp8kit_wheel_dirs}
          PATH_SUFFIXES include)
find_library(FP8KIT_CUBLASLT_LIBRARY NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12
             HINTS ${CUDAToolkit_LIBRARY_DIR} ${_fp8kit_wheel_dirs}
             PATH_SUFFIXES lib lib64)
if(NOT FP8KIT_CUBLASLT_INCLUDE_DIR OR NOT FP8KIT_CUBLASLT_LIBRARY)
  set(FP8KIT_CUDA_REASON "nvcc found but no cuBLASLt (install the CUDA toolkit's cuBLAS or the nvidia-cublas wheel)")
endif()
