#!/bin/bash
# A/B of the live switch's downtime: 6bdad27 (old) against HEAD (new), interleaved, same venv (torch 2.13 CPU)
out=/tmp/ab; rm -rf $out; mkdir -p $out
for rep in 1 2 3; do
  for side in old new; do
    tree=/tmp/old; [ $side = new ] && tree=/work/main
    for sc in reshape scale; do
      if [ $sc = reshape ]; then par="1,2,1"; gpus=2; else par="1,1,1"; gpus=1; fi
      (cd $tree && OMP_NUM_THREADS=1 PYTHONPATH=$tree timeout 300 /work/main/.venv/bin/python -m liver.cli run \
        --events /tmp/ab_$sc.txt --parallel $par --gpus $gpus --slots 2 --steps 100000 --end-after-events 4 \
        --ckpt-every 0 --companion-share 0 --set timeline=false --run-dir $out/$side-$sc-$rep > $out/$side-$sc-$rep.log 2>&1)
    done
  done
done
