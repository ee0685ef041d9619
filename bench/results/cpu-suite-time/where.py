"""Where a multi-process test's time goes: each event of the live and the restart run that
tests/test_native.py::test_live_reshapes_of_a_users_model_equal_restart_through_dcp left under --basetemp."""
import glob, json, sys
for run in sorted(glob.glob(sys.argv[1] + "/*_0/live")) + sorted(glob.glob(sys.argv[1] + "/*_0/restart")):
    r = json.load(open(run + "/report.json"))
    st = r["steps"]
    print(run.split("/")[-1], "steps", len(st), "steps' wall %.1f s" % (st[-1]["time"] - st[0]["time"]))
    for e in r["events"]:
        big = {k: round(v, 2) for k, v in e.items() if k.endswith("_s") and isinstance(v, float) and v > 0.3}
        print("  ", e["event"]["kind"], e["old"], "->", e["new"], "arrived->done %.2f" % (e["t_done"] - e["arrived"]), big)
