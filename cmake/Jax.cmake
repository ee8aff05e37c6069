# fp8kit._jax_ext: the XLA FFI handlers, exported as PyCapsules.
fp8kit_python_query(FP8KIT_XLA_FFI_INCLUDE "import jax.ffi; print(jax.ffi.include_dir())")
if(NOT FP8KIT_XLA_FFI_INCLUDE)
  message(FATAL_ERROR "fp8kit: building the JAX extension needs jax installed (or pass -DFP8KIT_JAX=OFF)")
endif()
file(GLOB FP8KIT_JAX_SRCS CONFIGURE_DEPENDS jax_ext/*.cc)
pybind11_add_module(_jax_ext MODULE ${FP8KIT_JAX_SRCS})
# SYSTEM: the XLA FFI headers trigger GCC warnings (always_inline,
# return-type) that are not ours to fix.
target_include_directories(_jax_ext SYSTEM PRIVATE ${FP8KIT_XLA_FFI_INCLUDE})
target_include_directories(_jax_ext PRIVATE jax_ext)
# The core is libfp8kit.so beside this module; the CUDA handlers reach the
# CUDA runtime through it (fp8kit/memory.h), so no cudart is linked here.
target_link_libraries(_jax_ext PRIVATE fp8kit)
set_target_properties(_jax_ext PROPERTIES INSTALL_RPATH "$ORIGIN")
install(TARGETS _jax_ext LIBRARY DESTINATION fp8kit)
