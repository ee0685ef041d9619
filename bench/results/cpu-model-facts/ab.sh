#!/bin/bash
# A/B of the live switch's downtime: OLD (default 72ecb4f, before the model's facts) against NEW
# (default: this checkout), interleaved, same venv (torch 2.13 CPU), three rounds, 10 live events a run.
# Usage: bash ab.sh [OLD_COMMIT] [OUT]; then python3 pool.py OUT > ab_switch.json
set -u
old_commit=${1:-72ecb4f}; out=${2:-/tmp/ab-facts}; here=$(cd "$(dirname "$0")" && pwd); new=$(cd "$here/../../.." && pwd)
rm -rf "$out" /tmp/ab-old; mkdir -p "$out"
git -C "$new" worktree add -f --detach /tmp/ab-old "$old_commit" >/dev/null
printf 'at step 8: reshape 1,1,2\n%s' "$(for i in $(seq 9); do [ $((i % 2)) = 1 ] && echo 'at step +8: reshape 1,2,1' || echo 'at step +8: reshape 1,1,2'; done)" > "$out/reshape.txt"
printf 'at step 8: scale-out 2\n%s' "$(for i in $(seq 9); do [ $((i % 2)) = 1 ] && echo 'at step +8: scale-in 1' || echo 'at step +8: scale-out 2'; done)" > "$out/scale.txt"
for rep in 1 2 3; do
  for side in old new; do
    tree=/tmp/ab-old; [ $side = new ] && tree=$new
    for sc in reshape scale; do
      if [ $sc = reshape ]; then par="1,2,1"; gpus=2; else par="1,1,1"; gpus=1; fi
      (cd $tree && OMP_NUM_THREADS=1 PYTHONPATH=$tree timeout 300 $new/.venv/bin/python -m liver.cli run \
        --events "$out/$sc.txt" --parallel $par --gpus $gpus --slots 2 --steps 100000 --end-after-events 4 \
        --ckpt-every 0 --companion-share 0 --set timeline=false --run-dir "$out/$side-$sc-$rep" > "$out/$side-$sc-$rep.log" 2>&1)
    done
  done
done
git -C "$new" worktree remove --force /tmp/ab-old
