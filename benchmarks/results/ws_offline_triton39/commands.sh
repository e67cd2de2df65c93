# Seventh session (2026-12-04, no GPU): the warp-specialized candidate of ws_preload_h200 compiled for sm_90a by
# Triton 3.6.0 (the device's) and 3.9.0, through ptxas, with benchmarks/scripts/wgmma_check.py. From the repository root:
T=/tmp/wsT; rm -rf $T && mkdir -p $T && cp -r raygrid benchmarks $T/ && rm $T/raygrid/kernels/gluon_attention.py
(cd $T && patch -p0 -s < benchmarks/results/ws_preload_h200/candidate_gluon_ws.diff)  # its triton_attention.py hunks
cp raygrid/kernels/triton_attention.py $T/raygrid/kernels/                          # do not apply: keep this tree's
# Triton 3.7 renamed two Gluon calls the candidate uses; for 3.9:
sed -i 's/tma\.async_copy_global_to_shared(/tma.async_load(/g; s/gl\.thread_barrier()/gl.barrier()/g' $T/raygrid/kernels/gluon_attention.py
(cd $T && PYTHONPATH=$T python benchmarks/scripts/wgmma_check.py) > wgmma_check_triton39.txt  # a Python with Triton 3.9
# For 3.6, the same without the sed, in a Python with Triton 3.6 -> wgmma_check_triton36.txt
