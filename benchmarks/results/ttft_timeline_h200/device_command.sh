# session 8 command 6: where a 32k prompt's TTFT goes, with the SM clock and power sampled during each run
out=$1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader
timeout 500 python3 benchmarks/scripts/ttft_timeline.py $out/ttft_timeline_32k.json --runs 10 2>&1 | grep -v Warning | tail -12
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
