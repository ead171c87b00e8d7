# hvdrun's elastic policy (tools/hvdrun/elastic.c) with shell programs as
# workers: worker ids and environment, replacement and blacklist,
# discovery, and how the job ends.
add_test(NAME integration.elastic.hvdrun
         COMMAND sh ${HVD_SH}/run_elastic_hvdrun.sh $<TARGET_FILE:hvdrun>)
set_tests_properties(integration.elastic.hvdrun PROPERTIES
                     LABELS "integration;elastic;beside" TIMEOUT 300)
