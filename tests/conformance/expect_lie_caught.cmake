# Runs the conformance suite on the kunlunxin backend over a fake libxpurt
# whose slot LIE returns success without doing the work
# (FAKE_XPU_LIE=<symbol>), and passes only if the suite reports failing
# tests, or dies of the lie (host memory the lying call handed back as
# done is still being written by the fake's device thread, and the suite
# frees it): a conformance suite that a lying runtime passes checks nothing.
#   cmake -DBIN=<runtime_conformance_test> -DLIE=<symbol> -P expect_lie_caught.cmake
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env FAKE_XPU_LIE=${LIE} FAKE_XPU_DELAY_US=1000
          ${BIN} --gtest_filter=*kunlunxin_fake*
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
# gtest prints each failed expectation at once ("file:line: Failure") and
# the test's "[  FAILED  ]" line when it ends (which a crash may prevent).
string(REGEX MATCHALL "runtime_conformance_test.cc:[0-9]+: Failure" failures "${out}")
string(REGEX MATCHALL "\\[  FAILED  \\] [A-Za-z/_.]+kunlunxin_fake," failed "${out}")
list(LENGTH failures count)
if(rc EQUAL 0)
  message(FATAL_ERROR "the conformance suite passed on a libxpurt whose ${LIE} lies:\n${out}")
endif()
if(count EQUAL 0)
  message(FATAL_ERROR "the conformance suite failed (exit ${rc}) without a failed expectation "
                      "on a libxpurt whose ${LIE} lies:\n${out}\n${err}")
endif()
message(STATUS "a lying ${LIE} was caught: ${count} failed expectations (exit ${rc}) in:")
foreach(line IN LISTS failed)
  message(STATUS "  ${line}")
endforeach()
