import gc, os, time, json, atexit
OUT = os.environ.get("GC_PROBE_OUT")
if OUT:
    _t = {}
    _rows = []
    def cb(phase, info):
        if phase == "start":
            _t["s"] = time.time()
        else:
            d = time.time() - _t.get("s", time.time())
            if d > 0.0005:
                _rows.append((round(_t["s"], 4), info["generation"], round(d * 1000, 2), info.get("collected", 0)))
                with open(f"{OUT}/gc-{os.getpid()}.jsonl", "a") as f:
                    f.write(json.dumps(_rows[-1]) + "\n")
    gc.callbacks.append(cb)
