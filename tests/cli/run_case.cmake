# Runs EXE with ARGS and checks the exit code (RC) and that stdout+stderr match REGEX.
execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT rc STREQUAL RC)
  message(FATAL_ERROR "exit code ${rc}, expected ${RC}\n${all}")
endif()
if(NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}':\n${all}")
endif()
