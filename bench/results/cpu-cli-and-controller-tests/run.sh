# this machine (2 cores, CPU), torch 2.13.0, from the repository root: `liver status` against a job that has ended
# (nothing listens at the URL), five times, wall seconds and exit code each (status.txt); whether the command line
# imports torch (imports.txt); the in-process controller tests with their durations (controller-tests.txt).
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
OUT=bench/results/cpu-cli-and-controller-tests
: > $OUT/status.txt
for i in 1 2 3 4 5; do
  /usr/bin/time -f "wall %e s" .venv/bin/python -m liver.cli status --url http://127.0.0.1:1 --token x >> $OUT/status.txt 2>&1
  echo "exit $?" >> $OUT/status.txt
done
.venv/bin/python -c "import sys; from liver.cli import main; print('torch imported by liver.cli:', 'torch' in sys.modules)" > $OUT/imports.txt
.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_controller.py --durations=0 > $OUT/controller-tests.txt 2>&1
