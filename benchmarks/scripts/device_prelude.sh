# Sourced first by a session's device command (benchmarks/results/sNN/command_*.sh, carried with `.devlite`), with
# the commit as its first argument: the environment the runs take (the bundle's site-packages, the commit the
# records name, caches), `left [LIMIT]` (seconds left of LIMIT, 570 by default, from the command's start: a
# `timeout` for each step), `$R` (`$OUT/r`, where results go) with the card in `$R/gpu.txt`, and the bundle
# installed once a machine start. Commands recorded before it was written spell the same lines out.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-570} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" | tee -a $R/gpu.txt
