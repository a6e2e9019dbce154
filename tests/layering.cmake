# The engine's libraries (one folder each) link in one direction (core <- cpu, cuda <- engine): tools/check_layering.py reads every
# engine/ and kernels/ #include and the built static libraries' symbol tables, and fails on any arrow up or sideways.
set(DS_LAYERING_LIBS --lib core=$<TARGET_FILE:diffscope_core> --lib cpu=$<TARGET_FILE:diffscope_cpu>
    --lib engine=$<TARGET_FILE:diffscope_engine>)
if(TARGET diffscope_cuda)
  list(APPEND DS_LAYERING_LIBS --lib cuda=$<TARGET_FILE:diffscope_cuda>)
endif()
add_test(NAME layering COMMAND ${DS_PYTHON} ${PROJECT_SOURCE_DIR}/tools/check_layering.py
         --source ${PROJECT_SOURCE_DIR} ${DS_LAYERING_LIBS})
