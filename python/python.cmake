# The Python module diffscope (python/): the native part _diffscope (nanobind) over the engine's libraries, and the
# package's Python files beside it in ${PROJECT_BINARY_DIR}/python/diffscope, so that PYTHONPATH=<build>/python
# imports the build's module (scripts/setup.sh points the project's .venv there). pip install . builds the same
# target through scikit-build-core (pyproject.toml) and installs it with the package.
if(NOT DEFINED DS_PYTHON_FOR_MODULE)
  if(DEFINED SKBUILD)  # pip / scikit-build-core: the Python it builds for
    set(DS_PYTHON_FOR_MODULE ${Python_EXECUTABLE})
  elseif(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python3)
    set(DS_PYTHON_FOR_MODULE ${PROJECT_SOURCE_DIR}/.venv/bin/python3)
  endif()
endif()
if(DS_PYTHON_FOR_MODULE)
  set(Python_EXECUTABLE ${DS_PYTHON_FOR_MODULE})
endif()
if(DS_BUILD_PYTHON STREQUAL "ON")
  find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
else()
  find_package(Python 3.9 COMPONENTS Interpreter Development.Module)
endif()
set(DS_NANOBIND_DIR "")
if(Python_FOUND)
  execute_process(COMMAND ${Python_EXECUTABLE} -m nanobind --cmake_dir OUTPUT_VARIABLE DS_NANOBIND_DIR
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE nb_rc)
  if(NOT nb_rc EQUAL 0)
    set(DS_NANOBIND_DIR "")
  endif()
endif()
if(NOT Python_FOUND OR NOT DS_NANOBIND_DIR)
  if(DS_BUILD_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "diffscope: DS_BUILD_PYTHON=ON needs Python's development headers and nanobind "
                        "(scripts/setup.sh installs both into .venv)")
  endif()
  message(STATUS "diffscope: no Python with headers and nanobind: the Python module is not built")
  return()
endif()
set(nanobind_DIR ${DS_NANOBIND_DIR})
find_package(nanobind CONFIG REQUIRED)
message(STATUS "diffscope: building the Python module for ${Python_EXECUTABLE} (${Python_VERSION})")

nanobind_add_module(_diffscope NB_STATIC ${PROJECT_SOURCE_DIR}/python/src/module.cpp)
target_link_libraries(_diffscope PRIVATE diffscope_engine)
target_compile_options(_diffscope PRIVATE -Wall -Wextra)
set_target_properties(_diffscope PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/python/diffscope)
# The package's Python files, copied when they change (configure_file re-runs CMake on a change).
file(GLOB DS_PY_FILES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/diffscope/*.py
     ${PROJECT_SOURCE_DIR}/python/diffscope/*.pyi ${PROJECT_SOURCE_DIR}/python/diffscope/py.typed)
foreach(f ${DS_PY_FILES})
  get_filename_component(name ${f} NAME)
  configure_file(${f} ${PROJECT_BINARY_DIR}/python/diffscope/${name} COPYONLY)
endforeach()
install(TARGETS _diffscope LIBRARY DESTINATION diffscope COMPONENT python)

if(DS_BUILD_TESTS)
  # pytest on the build's module (python/tests; they skip the GPU cases without a GPU, saying why).
  add_test(NAME python_tests
           COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/python/tests)
  set(env "PYTHONPATH=${PROJECT_BINARY_DIR}/python;DS_SOURCE_DIR=${PROJECT_SOURCE_DIR};DS_BINARY_DIR=${PROJECT_BINARY_DIR};MPLBACKEND=Agg")
  if(DS_SANITIZE)
    # The interpreter is not instrumented: the sanitizers' runtime is preloaded, and leaks are not reported (the
    # interpreter keeps its objects until exit by design).
    # libstdc++ is preloaded with it, so that ASan's interceptor of C++ throws finds the real one at start.
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so OUTPUT_VARIABLE asan_rt
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so OUTPUT_VARIABLE cxx_rt
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    list(APPEND env "LD_PRELOAD=${asan_rt} ${cxx_rt}" "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1")
  endif()
  set_tests_properties(python_tests PROPERTIES ENVIRONMENT "${env}" TIMEOUT 3600)
endif()

if(DS_BUILD_TESTS AND NOT DS_SANITIZE AND EXISTS ${PROJECT_SOURCE_DIR}/examples/noise_cancellation.py)
  # The example notebook (a percent-format script Jupyter opens), run headless: its figures go to the build folder.
  add_test(NAME python_example
           COMMAND ${Python_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/noise_cancellation.py
                   --out ${PROJECT_BINARY_DIR}/examples)
  set_tests_properties(python_example PROPERTIES
    ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;MPLBACKEND=Agg" TIMEOUT 3600)
endif()
