# fp8kit._jax_ext: the XLA FFI handlers, exported as PyCapsules.
execute_process(COMMAND "${Python_EXECUTABLE}" -c "import jax.ffi; print(jax.ffi.include_dir())"
                OUTPUT_VARIABLE FP8KIT_XLA_FFI_INCLUDE OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE _fp8kit_jax_found)
if(NOT _fp8kit_jax_found EQUAL 0)
  message(FATAL_ERROR "fp8kit: building the JAX extension needs jax installed (or pass -DFP8KIT_JAX=OFF)")
endif()
file(GLOB FP8KIT_JAX_SRCS CONFIGURE_DEPENDS jax_ext/*.cc)
pybind11_add_module(_jax_ext MODULE ${FP8KIT_JAX_SRCS})
target_include_directories(_jax_ext PRIVATE ${FP8KIT_XLA_FFI_INCLUDE} jax_ext)
target_link_libraries(_jax_ext PRIVATE fp8kit_core)
if(FP8KIT_WITH_CUDA)
  target_link_libraries(_jax_ext PRIVATE CUDA::cudart_static)
endif()
install(TARGETS _jax_ext LIBRARY DESTINATION fp8kit)
