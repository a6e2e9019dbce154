# CLI behaviour that needs the real program: exit codes and messages for bad arguments.
add_test(NAME cli.bad_arguments COMMAND ${CMAKE_COMMAND} -DRUN=$<TARGET_FILE:diffscope-run>
         -DFIXTURE=${PROJECT_SOURCE_DIR}/tests/fixtures/diff_mha_d32_f32 -P ${PROJECT_SOURCE_DIR}/tests/scripts/cli_bad_arguments.cmake)
# Ctrl-C during --generate keeps and reports what was generated (exit 130).
if(EXISTS ${PROJECT_SOURCE_DIR}/assets/models/diffllama-demo/config.json)
  add_test(NAME cli.generate_sigint COMMAND ${DS_PYTHON} ${PROJECT_SOURCE_DIR}/tests/scripts/run_sigint_check.py
           $<TARGET_FILE:diffscope-run> ${PROJECT_SOURCE_DIR}/assets/models/diffllama-demo)
  set_tests_properties(cli.generate_sigint PROPERTIES TIMEOUT 1200)
  # Ctrl-C during --outliers stops the attention logits' passes between layers: nothing written, exit 130.
  add_test(NAME cli.outliers_sigint COMMAND ${DS_PYTHON} ${PROJECT_SOURCE_DIR}/tests/scripts/run_outliers_sigint_check.py
           $<TARGET_FILE:diffscope-run> ${PROJECT_SOURCE_DIR}/assets/models/diffllama-demo
           ${CMAKE_CURRENT_BINARY_DIR}/cli_outliers_sigint)
  set_tests_properties(cli.outliers_sigint PROPERTIES TIMEOUT 1200)
endif()
