# diffscope-scan end to end on the demo pair: arguments, files, a comparison report with CSV and PNG, Ctrl-C.
# fontconfig (cairo's text) keeps a small allocation for the life of the process: LeakSanitizer is told so.
add_test(NAME cli.scan COMMAND ${DS_PYTHON} ${PROJECT_SOURCE_DIR}/tests/scripts/scan_cli_check.py
         $<TARGET_FILE:diffscope-scan> ${PROJECT_SOURCE_DIR}/assets/models/diffllama-demo
         ${PROJECT_SOURCE_DIR}/assets/models/llama-demo ${CMAKE_CURRENT_BINARY_DIR}/scan_cli)
set_tests_properties(cli.scan PROPERTIES TIMEOUT 600 ENVIRONMENT
                     "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/scripts/lsan_fontconfig.supp")
# --shard I/N and --merge: the shards' reports merged equal one run's (JSON but the timings, CSV and plot).
add_test(NAME cli.scan_shard COMMAND ${DS_PYTHON} ${PROJECT_SOURCE_DIR}/tests/scripts/scan_shard_check.py
         $<TARGET_FILE:diffscope-scan> ${PROJECT_SOURCE_DIR}/assets/models/diffllama-demo
         ${PROJECT_SOURCE_DIR}/assets/models/llama-demo ${CMAKE_CURRENT_BINARY_DIR}/scan_shard)
set_tests_properties(cli.scan_shard PROPERTIES TIMEOUT 600 ENVIRONMENT
                     "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/scripts/lsan_fontconfig.supp")
