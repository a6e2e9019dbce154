# Each bad invocation must exit 2 with one line naming the problem; a good one exits 0.
function(expect_exit code needle)
  execute_process(COMMAND ${RUN} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL ${code})
    message(FATAL_ERROR "diffscope-run ${ARGN}: exit ${rc}, expected ${code}\n${out}${err}")
  endif()
  if(NOT "${err}${out}" MATCHES "${needle}")
    message(FATAL_ERROR "diffscope-run ${ARGN}: output lacks '${needle}':\n${out}${err}")
  endif()
endfunction()
expect_exit(2 "unknown argument '--frobnicate'" --frobnicate)
expect_exit(2 "--model DIR is required" --token-ids 1,2)
expect_exit(2 "give a prompt" --model ${FIXTURE})
expect_exit(2 "not an integer" --model ${FIXTURE} --token-ids 1,x,3)
expect_exit(2 "--backend must be cpu, cuda, cuda:N or auto" --model ${FIXTURE} --token-ids 1 --backend tpu)
expect_exit(2 "--backend must be cpu, cuda, cuda:N or auto" --model ${FIXTURE} --token-ids 1 --backend cuda:x)
expect_exit(2 "--backend must be cpu, cuda, cuda:N or auto" --model ${FIXTURE} --token-ids 1 --backend cpu,3)
expect_exit(2 "--gpu-mem-limit: '20Q' is not a size" --model ${FIXTURE} --token-ids 1 --gpu-mem-limit 20Q)
expect_exit(2 "--gpu-mem-limit: '12' is not a size of at least 1M" --model ${FIXTURE} --token-ids 1 --gpu-mem-limit 12)
# A layer split the devices cannot hold: refused before loading, with the numbers (exit 3).
expect_exit(3 "does not fit the 2 devices given: it needs about" --model ${FIXTURE} --token-ids 1 --backend cpu,cpu --gpu-mem-limit 1M)
expect_exit(2 "--lambda takes LAYER=VALUE" --model ${FIXTURE} --token-ids 1 --lambda 3)
expect_exit(2 "layer 7 does not exist" --model ${FIXTURE} --token-ids 1,2 --lambda 7=0.5 --backend cpu)
expect_exit(2 "not a finite number" --model ${FIXTURE} --token-ids 1 --lambda-scale nan)
expect_exit(3 "outside the vocabulary" --model ${FIXTURE} --token-ids 1,100000 --backend cpu)
expect_exit(3 "no such folder" --model /nonexistent/model --token-ids 1 --backend cpu)
expect_exit(0 "rank" --model ${FIXTURE} --token-ids 1,2,3 --backend cpu --top-k 3)
# Map queries and prompt files (a temporary folder in the build tree).
set(T ${CMAKE_CURRENT_BINARY_DIR}/cli_queries)
file(MAKE_DIRECTORY ${T})
file(WRITE ${T}/ids.txt "1, 5 9\n200\t7 7 33 12 100\n")
file(WRITE ${T}/bad_ids.txt "1 2 x 4\n")
expect_exit(2 "write into --dump" --model ${FIXTURE} --token-ids 1,2 --backend cpu --view 0.0)
expect_exit(2 "go with --view" --model ${FIXTURE} --token-ids 1,2 --backend cpu --grid 4,4 --dump ${T}/x.safetensors)
expect_exit(2 "--rect: each range" --model ${FIXTURE} --token-ids 1,2 --view 0.0 --rect 3:1,0:2 --dump ${T}/x.safetensors)
expect_exit(2 "--pool must be max or mean" --model ${FIXTURE} --token-ids 1 --view 0.0 --pool median --dump ${T}/x.safetensors)
expect_exit(2 "give one of" --model ${FIXTURE} --token-ids 1 --token-ids-file ${T}/ids.txt)
expect_exit(3 "nothere.txt: cannot open" --model ${FIXTURE} --token-ids-file ${T}/nothere.txt --backend cpu)
# Not regular files: refused at once by name (a FIFO or /dev/zero used to block or grow without end).
expect_exit(3 "cli_queries: is a directory, not a prompt file" --model ${FIXTURE} --prompt-file ${T} --backend cpu)
expect_exit(3 "/dev/zero: is not a regular file" --model ${FIXTURE} --prompt-file /dev/zero --backend cpu)
expect_exit(3 "/dev/zero: is not a regular file" --model ${FIXTURE} --token-ids-file /dev/zero --backend cpu)
execute_process(COMMAND mkfifo ${T}/fifo.txt ERROR_QUIET)
expect_exit(3 "fifo.txt: is not a regular file" --model ${FIXTURE} --prompt-file ${T}/fifo.txt --backend cpu)
expect_exit(3 "bad_ids.txt: 'x' is not an integer" --model ${FIXTURE} --token-ids-file ${T}/bad_ids.txt --backend cpu)
expect_exit(2 "row position 9 is outside" --model ${FIXTURE} --token-ids-file ${T}/ids.txt --backend cpu --rows 9 --dump ${T}/r.safetensors)
expect_exit(2 "head 99 does not exist" --model ${FIXTURE} --token-ids-file ${T}/ids.txt --backend cpu --view 0.99 --dump ${T}/v.safetensors)
# Checked before the forward, exit 2, and --stats not written (it used to be, before the late failure).
file(REMOVE ${T}/late.json)
expect_exit(2 "--rect" --model ${FIXTURE} --token-ids-file ${T}/ids.txt --backend cpu --view 0.0 --rect 50:60,0:4
            --dump ${T}/v.safetensors --stats ${T}/late.json)
expect_exit(2 "layer 9 does not exist" --model ${FIXTURE} --token-ids-file ${T}/ids.txt --backend cpu --view 9.0
            --dump ${T}/v.safetensors --stats ${T}/late.json)
if(EXISTS ${T}/late.json)
  message(FATAL_ERROR "--stats was written although the arguments were refused")
endif()
# Logits that overflow are an error, not a NaN top-k.
expect_exit(3 "logits are not finite" --model ${FIXTURE} --token-ids 1,2,3 --backend cpu --lambda-scale 1e300)
expect_exit(0 "wrote .*q.safetensors" --model ${FIXTURE} --token-ids-file ${T}/ids.txt --backend cpu --rows 0,-1
            --view 1.2 --grid 4,3 --pool mean --rect 2:9,0:8 --dump ${T}/q.safetensors --stats ${T}/s.json)
if(NOT EXISTS ${T}/s.json)
  message(FATAL_ERROR "--stats wrote no file")
endif()
file(READ ${T}/s.json stats)
if(NOT stats MATCHES "\"entropy1\"" OR NOT stats MATCHES "\"max_logit2\"" OR NOT stats MATCHES "\"max_abs_hidden\": [0-9]")
  message(FATAL_ERROR "--stats lacks the statistics:\n${stats}")
endif()
# Generation: bad values are refused with one line; a good run prints the continuation, and --json has
# "generated" (the ids) and "stop_reason"; --rows of a generated position (n = 3 + 4) is answered.
expect_exit(2 "--generate must be between 1" --model ${FIXTURE} --token-ids 1,2 --generate 0)
expect_exit(2 "--temperature must be >= 0" --model ${FIXTURE} --token-ids 1,2 --generate 2 --temperature -1)
expect_exit(2 "--top-p must be in" --model ${FIXTURE} --token-ids 1,2 --generate 2 --top-p 1.5)
expect_exit(2 "go with --generate" --model ${FIXTURE} --token-ids 1,2 --seed 3)
expect_exit(0 "generated ids:.*4 tokens in" --model ${FIXTURE} --token-ids 1,2,3 --backend cpu --generate 4)
expect_exit(0 "\"generated\":\\[[0-9]+,[0-9]+,[0-9]+,[0-9]+\\].*\"stop_reason\":\"max_tokens\"" --model ${FIXTURE}
            --token-ids 1,2,3 --backend cpu --generate 4 --temperature 0.8 --top-p 0.9 --sample-top-k 50 --seed 5 --json)
expect_exit(0 "wrote .*g.safetensors" --model ${FIXTURE} --token-ids 1,2,3 --backend cpu --generate 4 --rows 6
            --dump ${T}/g.safetensors)
expect_exit(2 "row position 7 is outside" --model ${FIXTURE} --token-ids 1,2,3 --backend cpu --generate 4 --rows 7
            --dump ${T}/g.safetensors)
# A full-map --dump that cannot fit in memory or on disk is refused before the forward, pointing to --rows / --view
# (the fixture with room for 40000 positions: its maps would need ~80 GB).
file(COPY ${FIXTURE}/ DESTINATION ${T}/longpos)
file(READ ${T}/longpos/config.json cfg)
string(REGEX REPLACE "\"max_position_embeddings\": *[0-9]+" "\"max_position_embeddings\": 40000" cfg "${cfg}")
file(WRITE ${T}/longpos/config.json "${cfg}")
string(REPEAT "7 " 40000 long_ids)
file(WRITE ${T}/long_ids.txt "${long_ids}")
expect_exit(2 "ask --rows and/or --view instead" --model ${T}/longpos --token-ids-file ${T}/long_ids.txt --backend cpu
            --dump ${T}/full.safetensors)
if(EXISTS ${T}/full.safetensors)
  message(FATAL_ERROR "the refused dump was written")
endif()
# The lambda sweep: refused before the forward when the model cannot do it, and in the --json output when it can.
expect_exit(2 "--sweep: lambda sweep: layer 99 does not exist" --model ${FIXTURE} --token-ids 1,2,3 --backend cpu
            --sweep 99,0,1,5)
expect_exit(2 "--sweep: expected LAYER,FROM,TO,STEPS" --model ${FIXTURE} --token-ids 1,2,3 --backend cpu --sweep 1,0,1)
expect_exit(2 "--sweep-head goes with --sweep" --model ${FIXTURE} --token-ids 1,2,3 --backend cpu --sweep-head 1)
expect_exit(0 "\"sweep\":{\"heads\":\\[0,1,2,3\\],\"lambda\":[-0-9.e]+,\"layer\":1,\"points\":\\[{\"entropy_diff\"" --model ${FIXTURE}
            --token-ids 1,2,3 --backend cpu --sweep 1,0,1,4 --json)
