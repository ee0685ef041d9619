import json, glob, sys
OUT, RUNS = sys.argv[1], sys.argv[2]  # the probe's folder, the bench's run folder
rows = []
for f in glob.glob(OUT + "/*.jsonl"):
    pid = f.split("-")[-1].split(".")[0]
    for l in open(f):
        t, g, d, c = json.loads(l)
        rows.append((t, g, d, c, pid))
for run in sorted(glob.glob(RUNS + "/s*-live-0")):
    r = json.load(open(run + "/report.json"))
    for e in r["events"]:
        if e.get("switch_start") is None: continue
        s0, s1 = e["switch_start"], e["switch_end"]
        ns = e.get("normal_step_s") or 0
        hits = [(round(t - s0, 4), g, d, pid) for t, g, d, c, pid in rows if s0 - 0.03 <= t <= s1 + 2 * ns + 0.05]
        print(run.split("/")[-1], e["old"], "->", e["new"], f"down={e['downtime_s']*1000:.1f} pause={e['pause_s']*1000:.1f} first={e['first_step_extra_s']*1000:.1f}", hits)
