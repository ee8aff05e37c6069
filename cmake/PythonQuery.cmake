# fp8kit_python_query(<out-var> <python code>)
#
# Runs Python code that imports jax or torch to ask for header and library
# paths. Under pip's build isolation the interpreter is the target
# environment's, but its site-packages are hidden; torch and jax are not
# build requirements (they are large and already installed where fp8kit is
# going), so the target environment's purelib is put back on PYTHONPATH
# for these queries only.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
  OUTPUT_VARIABLE FP8KIT_TARGET_PURELIB OUTPUT_STRIP_TRAILING_WHITESPACE)

function(fp8kit_python_query out code)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -E env "PYTHONPATH=${FP8KIT_TARGET_PURELIB}"
            "${Python_EXECUTABLE}" -c "${code}"
    OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_VARIABLE _err
    RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    set(${out} "" PARENT_SCOPE)
    set(${out}_ERROR "${_err}" PARENT_SCOPE)
  else()
    set(${out} "${_out}" PARENT_SCOPE)
  endif()
endfunction()
