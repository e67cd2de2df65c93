# session 11 command 3: the batch-1 timeline at 512 again, with each thread's CPU share; then with OMP_NUM_THREADS=1; the host CPU
out=$1
lscpu | grep -i "model name\|^CPU(s)\|thread\|MHz\|NUMA node0" | tee $out/lscpu.txt
timeout 120 python3 .devrun/step_timeline.py $out 512 off,on 2>&1 | grep "^off\|^on\|rror" | tail -8
NOTE=_omp1 OMP_NUM_THREADS=1 timeout 120 python3 .devrun/step_timeline.py $out 512 off,on 2>&1 | grep "^off\|^on\|rror" | tail -8
