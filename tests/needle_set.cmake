# tools/make_needle_set.py (multi-needle retrieval sets for diffscope-scan): exact token lengths as the engine counts
# them (diffscope-run --tokenize-jsonl), answer spans, depth ordering, determinism and its one-line flag errors, on
# the demo model's tokenizer. The generator counts with the `tokenizers` package of ${DS_PYTHON} (.venv).
if(EXISTS ${PROJECT_SOURCE_DIR}/assets/models/diffllama-demo/tokenizer.json)
  add_test(NAME needle_set
           COMMAND ${DS_PYTHON} ${PROJECT_SOURCE_DIR}/tests/scripts/check_needle_set.py
                   --runner $<TARGET_FILE:diffscope-run> --python ${DS_PYTHON} --work ${PROJECT_BINARY_DIR}/needle_set)
  set_tests_properties(needle_set PROPERTIES TIMEOUT 1500)
endif()
