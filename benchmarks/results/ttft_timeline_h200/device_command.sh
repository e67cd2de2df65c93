# session 8 command 5: where a 32k prompt's TTFT goes beyond the GPU's passes (no profiler)
out=$1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader
timeout 500 python3 benchmarks/scripts/ttft_timeline.py $out/ttft_timeline_32k.json --runs 8 2>&1 | grep -v Warning | tail -12
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
