for i in 1 2; do
  for w in with without; do
    cd /tmp/ab-$w
    s=$(date +%s.%N)
    PYTHONPATH=/tmp/ab-$w OMP_NUM_THREADS=1 timeout 900 /work/main/.venv/bin/python -m pytest -q -x -p no:cacheprovider tests/test_run.py tests/test_heal.py tests/test_suspend.py > /tmp/ab-$w-$i.log 2>&1
    e=$(date +%s.%N)
    echo "$w $i $(tail -1 /tmp/ab-$w-$i.log) wall $(python3 -c "print(round($e-$s,1))")"
  done
done
