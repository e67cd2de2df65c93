# one H200, 2026-12-03, tree f5a7f47 (the command's prefix sets RAYGRID_GIT_COMMIT=f5a7f47)
#!/usr/bin/env bash
# One GPU: the two-stream mixed launch's GPU tests, then mixed step and W1 off/on, two rounds.
cd "$(dirname "$0")/.."
timeout 560 bash benchmarks/scripts/ab_mixed_launch.sh $OUT/r 2
true
