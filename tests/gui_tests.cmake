# GUI tests: run the real diffscope window under Xvfb in --screenshot mode and check the PNG and the
# --state-json sidecar (tests/gui_check.py). xvfb-run is required: when it is missing the tests fail with a hint
# rather than being skipped (CI installs it).
if(DS_BUILD_GUI AND TARGET diffscope)
  find_program(XVFB_RUN xvfb-run)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  if(NOT XVFB_RUN)
    message(WARNING "xvfb-run not found: the gui_* tests will fail. HINT: apt-get install xvfb")
    set(XVFB_RUN "")
  endif()
  set(DS_GUI_CASES fixture lambda corrupt text light export bad_args view row replay hybrid generate)
  if(EXISTS ${PROJECT_SOURCE_DIR}/assets/models/diffllama-demo/config.json)
    list(APPEND DS_GUI_CASES demo prompt_file corpus compare split)
  endif()
  # gui_corpus compares the Corpus panel's report with diffscope-scan's when that program is built.
  set(DS_GUI_SCAN_EXE "")
  if(TARGET diffscope-scan)
    set(DS_GUI_SCAN_EXE --scan-exe $<TARGET_FILE:diffscope-scan>)
  endif()
  foreach(case ${DS_GUI_CASES})
    add_test(NAME gui_${case}
             COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/gui_check.py --exe $<TARGET_FILE:diffscope>
                     --run-exe $<TARGET_FILE:diffscope-run> ${DS_GUI_SCAN_EXE}
                     --xvfb "${XVFB_RUN}" --source ${PROJECT_SOURCE_DIR} --work ${PROJECT_BINARY_DIR}/gui_tests ${case})
    set_tests_properties(gui_${case} PROPERTIES TIMEOUT 3000 LABELS gui)
  endforeach()
endif()
