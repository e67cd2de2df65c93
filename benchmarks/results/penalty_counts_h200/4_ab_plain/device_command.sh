# Command 4: W1 plain, old tree (b33c1aa + the bench option) against new, alternating.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
R=$out/r; mkdir -p $R
for i in 1 2; do
  (cd .devrun/old && out=$R && run w1_plain_old$i bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256)
  (out=$R; run w1_plain_new$i bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256)
done
cp .devrun/c4.sh $R/device_command.sh
tar -C $out -czf $out/c4.tgz r && rm -rf $R
