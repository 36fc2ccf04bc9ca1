# `mpirun -np NP moekit run --ep NP --check --dump` against `moekit run --dump` (ep = 1) on
# the same preset and tokens: --check must print check: PASS and the two dumps (out,
# topk_ids, topk_weights of the whole batch) must be the same bytes.
file(MAKE_DIRECTORY ${DIR})
set(problem run --preset ${PRESET} --tokens ${TOKENS} --backend cpu)
execute_process(COMMAND ${CLI} ${problem} --dump ${DIR}/ep1.safetensors
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ep=1 run failed (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${MPIEXEC} ${NP} ${MPIEXEC_FLAGS} ${CLI} ${problem} --ep ${NP} --check
                        --dump ${DIR}/ep${NP}.safetensors
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "\ncheck: PASS")
  message(FATAL_ERROR "ep=${NP} run failed (${rc}):\n${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${DIR}/ep1.safetensors ${DIR}/ep${NP}.safetensors
                RESULT_VARIABLE same)
if(NOT same EQUAL 0)
  message(FATAL_ERROR "ep=${NP} and ep=1 dumps differ")
endif()
message("ep=${NP} and ep=1 dumps are the same bytes")
