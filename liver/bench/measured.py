"""``liver bench measured``: the README's "Measured" section, rendered from the JSON files that back
each claim (``bench/results/claims.toml``), so that no figure in the README is typed by hand.
``--write`` replaces the section between its markers; ``--check`` says whether it is current."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Callable

from liver.policy.outcome import Outcome, outcome_of

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- measured:begin (liver bench measured --write) -->", "<!-- measured:end -->"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2%}"


def _ci(ci: list[float] | None) -> str:
    return "" if not ci else f" [{ci[0]:+.2%}, {ci[1]:+.2%}]"


def _range(xs: list[float], fmt: str) -> str:
    lo, hi = min(xs), max(xs)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{format(lo, fmt)}-{format(hi, fmt)}"


def _handoffs(d: dict[str, Any]) -> list[str]:
    kinds: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for e in d["events"]:
        kinds.setdefault((e["event"], e["old"], e["new"]), []).append(e)
    parts = []
    for (kind, _, _), es in kinds.items():
        live = " / ".join(f"{e['downtime_live_s']:.3f}" for e in es)
        restart = " / ".join(f"{e['downtime_restart_s']:.1f}" for e in es)
        parts.append(f"{kind} {es[0]['old']} -> {es[0]['new']}: live {live} s, restart {restart} s")
    ratios = [e["ratio"] for e in d["events"] if e.get("ratio")]
    lines = ["; ".join(parts) + f" ({_range(ratios, '.0f')}x less downtime live)."]
    floors = [(e["transfer_s"], e["transfer_floor_s"]) for e in d["events"] if e.get("transfer_floor_s")]
    if floors:
        lines.append(f"Transfer {_range([t * 1e3 for t, _ in floors], '.0f')} ms against a floor of "
                     f"{_range([f * 1e3 for _, f in floors], '.0f')} ms (busiest rank's bytes over the measured "
                     f"point-to-point {d['p2p_GBps']:.0f} GB/s).")
    equal = all(e.get("digest_equal_live") and e.get("digest_equal_restart") is not False for e in d["events"])
    lines.append("State digest equal across every handoff." if equal else "DIGESTS DIFFER at some handoff.")
    if d.get("losses_live_equal_restart"):
        lines.append("Live and restart losses equal bit for bit.")
    by_kind = d.get("steady_overhead_by_kind") or {}
    ov = [f"{k} {_pct(v['steady_overhead'])}{_ci(v.get('steady_overhead_ci95'))}" for k, v in by_kind.items()
          if v.get("steady_overhead") is not None]
    if ov:
        lines.append("Steady-state overhead while preparing: " + ", ".join(ov) + ".")
    return lines


def _overhead(d: dict[str, Any]) -> list[str]:
    by_kind = d["steady_overhead_by_kind"]
    n = sum(v["events"] for v in by_kind.values())
    ov = [f"{k} {_pct(v['steady_overhead'])}{_ci(v.get('steady_overhead_ci95'))} (placebo "
          f"{_pct(v.get('steady_overhead_placebo'))})" for k, v in by_kind.items()]
    return [f"{n} live events; steady-state overhead pooled per kind, bootstrap 95% intervals over the events: "
            + ", ".join(ov) + "."]


def _transfer(d: dict[str, Any]) -> list[str]:
    rows = [f"{name}: {m['moved_GiB']:.1f} GiB moved in {m['median_transfer_preallocated_s'] * 1e3:.1f} ms = "
            f"{m['achieved_preallocated_GBps']:.0f} GB/s ({m['fraction_of_p2p_preallocated']:.0%} of point-to-point), "
            f"peak extra memory {m['peak_extra_allocated_GiB']:.2f} GiB, bit-exact: {m['bit_exact']}"
            for name, m in d["models"].items()]
    return ["; ".join(rows) + f" (point-to-point {d['p2p_GBps']:.0f} GB/s in the same call)."]


def _cpu_reconfig(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        out.append(f"{r['scenario']}: live {r['downtime_live_s'] * 1e3:.0f} ms, restart {r['downtime_restart_s']:.2f} s "
                   f"({r['ratio']:.0f}x; forked restart {r['ratio_forked']:.1f}x), steady-state overhead "
                   f"{_pct(r['steady_overhead'])}{_ci(r.get('steady_overhead_ci95'))} over {r['live_events']} events "
                   f"(placebo {_pct(r.get('steady_overhead_placebo'))}).")
    return out


def _boot(rows: list[dict[str, Any]]) -> list[str]:
    return ["; ".join(f"{r['start']}: {r['cpu_s']:.3f} s of CPU, {r['wall_s']:.3f} s wall" for r in rows)
            + f" (median of {rows[0]['repeats']})."]


def _core_binding(d: dict[str, Any]) -> list[str]:
    b, u = d["bound"]["pooled"], d["unbound"]["pooled"]
    return [f"bound {b['median_ms']:.1f} ms median (quartiles {b['p25_ms']:.1f}-{b['p75_ms']:.1f}), unbound "
            f"{u['median_ms']:.1f} ms ({u['p25_ms']:.1f}-{u['p75_ms']:.1f}), {d['repeats']} runs each, interleaved."]


def _plan(rows: list[dict[str, Any]]) -> list[str]:
    return ["; ".join(f"{r['scenario'].split(',')[0]} ({r['num_tasks']:,} tasks): {r['plan_s'] * 1e3:.0f} ms"
                      for r in rows) + "."]


def _plan_pickle(rows: list[dict[str, Any]]) -> list[str]:
    return ["; ".join(f"{r['model']} {r['old']} -> {r['new']}: plan {r['plan_cpu_s'] * 1e3:.2f} ms, unpickle "
                      f"{r['unpickle_cpu_s'] * 1e3:.2f} ms of CPU" for r in rows) + "."]


def _compat(d: dict[str, Any]) -> list[str]:
    why = "; ".join(f"{k}: {v}" for k, v in d["pytest_failed_why"].items())
    return [f"torch {d['torch']}, Python {d['python']}: the 1B model ({d['params'] / 1e9:.2f}B) trains at "
            f"{d['median_step_s'] * 1e3:.0f} ms a step, {d['median_tokens_per_s']:,.0f} tokens/s, MFU "
            f"{d['median_mfu']:.1%}, peak memory {d['peak_memory_gib']:.1f} GiB.",
            f"Tests there: {d['pytest_summary']}" + (f" ({why})." if why else ".")]


def _native_compat(d: dict[str, Any]) -> list[str]:
    ev = "; ".join(f"{e['event']} {e['old']} -> {e['new']}: {e['status']}"
                   + (", digest equal" if e["digest_equal"] else ", DIGEST DIFFERS") for e in d["gloo_events"])
    out = [f"torch {d['torch']}, Python {d['python']}, NCCL {d['nccl']}: the recipe's in-process tests "
           f"({d['pytest_summary']}); its live reshapes over gloo there: {ev}."]
    if "nccl_steps" in d:
        out.append(f"On the GPU over NCCL (one rank): {d['nccl_steps']} steps at {d['nccl_median_step_s'] * 1e3:.0f} "
                   f"ms, periodic DCP checkpoints at steps {', '.join(map(str, d['nccl_checkpoints']))}.")
    if "before_fix" in d:
        out.append(f"Before the fix: {d['before_fix']}.")
    return out


def _dcp(d: dict[str, Any]) -> list[str]:
    out = []
    for r in d["rows"]:
        where = "; ".join(f"{k}: save {v['save_GBps']:.2f} GB/s, load {v['load_GBps']:.2f} GB/s "
                          f"({len(v['save_s'])} each, the first left out)" for k, v in r["dirs"].items() if "save_GBps" in v)
        out.append(f"{r['model']} ({r['params'] / 1e9:.2f}B, {r['state_bytes'] / 1e9:.1f} GB of state) on one "
                   f"{r['device']}: step {r['step_s']:.2f} s; DCP {where}.")
    if d.get("local_copy_GBps"):
        size = d.get("local_copy_bytes", 1 << 30)
        size_text = f"{size >> 30} GiB" if size % (1 << 30) == 0 else f"{size >> 20} MiB"
        out.append(f"A copy within the device's memory: {d['local_copy_GBps']:.0f} GB/s ({size_text}, the bytes counted once).")
    return out + ([d["note"] + "."] if d.get("note") else [])


def _nodes(d: dict[str, Any]) -> list[str]:
    parts = [f"{e['event']} {e['old']} -> {e['new']}" + (f" (notice to {e['node']})" if e["node"] else " (node1 back)")
             + f": live {e['downtime_live_s']:.3f} s, restart {e['downtime_restart_s']:.1f} s, digest "
             + ("equal" if e["digest_equal_live"] and e["digest_equal_restart"] else "DIFFERS")
             for e in d["events"]]
    return ["; ".join(parts) + "."]


def _heal(d: dict[str, Any]) -> list[str]:
    h, c = d["heal"], d["checkpoint"]
    return [f"{d['params'] / 1e6:.1f}M parameters, {d['layout']}, one replica killed at step {d['kill_at_step']} "
            f"(checkpoint every {d['ckpt_every']}), {d['repeats']} runs each: healed from the survivor: stall "
            f"{h['stall_s']:.2f} s (runs {h['stall_s_range'][0]:.2f}-{h['stall_s_range'][1]:.2f}), {h['lost_steps']:g} "
            f"steps lost; from the checkpoint: stall {c['stall_s']:.2f} s, {c['lost_steps']:g} steps "
            f"({c['lost_work_s']:.1f} s of work) lost: {c['total_lost_s']:.1f} s against {h['total_lost_s']:.2f} s."]


def _vs_torchft(d: dict[str, Any]) -> list[str]:
    lv, tf = d["LiveR"], d["torchft"]
    return [f"{d['params'] / 1e6:.1f}M parameters, {d['replicas']} replicas of one process, one killed at step "
            f"{d['kill_at_step']}, {d['repeats']} interleaved runs each: LiveR stall {lv['stall_s']:.2f} s (runs "
            f"{lv['stall_s_range'][0]:.2f}-{lv['stall_s_range'][1]:.2f}), {lv['lost_steps']:g} steps lost; torchft "
            f"{d['torchft_version']} stall {tf['stall_s']:.2f} s (runs {tf['stall_s_range'][0]:.2f}-"
            f"{tf['stall_s_range'][1]:.2f}), {tf['lost_steps']:g} steps lost; time lost in all "
            f"{lv['total_lost_s']:.2f} s against {tf['total_lost_s']:.2f} s (steps {lv['median_step_s']:.2f} s and "
            f"{tf['median_step_s']:.2f} s)."]


def _join_vs_torchft(d: dict[str, Any]) -> list[str]:
    lv, tf = d["LiveR"], d["torchft"]
    live = [r for r in d["runs"] if r["system"].startswith("LiveR")]
    down = [r["downtime_s"] for r in live]
    return [f"{d['params'] / 1e6:.1f}M parameters, a second replica joins a job of one, {d['repeats']} interleaved runs "
            f"each: what the first replica lost, LiveR's scale-out {lv['stall_s']:.2f} s (runs "
            f"{lv['stall_s_range'][0]:.2f}-{lv['stall_s_range'][1]:.2f}; its switch {min(down):.2f}-{max(down):.2f} s, "
            f"the rest the slowdown beside the cold joiner's start) against torchft {d['torchft_version']}'s join "
            f"{tf['stall_s']:.2f} s (runs {tf['stall_s_range'][0]:.2f}-{tf['stall_s_range'][1]:.2f}); "
            f"{lv['lost_steps']:g} and {tf['lost_steps']:g} steps lost."]


def _recovery_kind(row: dict[str, Any]) -> str:
    out = outcome_of(row)
    return "heal" if out is Outcome.HEALED else "drop" if out is Outcome.DROPPED else "rollback"


def _soak(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for d in rows:
        dt = d["downtime_s"]
        live = [dt[k]["median"] for k in ("scale-out", "scale-in", "reshape") if dt.get(k)]
        out.append(f"seed {d['seed']}: {d['events_asked']} actions ({', '.join(f'{v} {k}' for k, v in sorted(d['actions'].items()))}); "
                   f"{d['handoffs_and_recoveries']} handoffs and recoveries, {d['digest_equal']} digest-equal, "
                   f"{len(d['digest_different'])} different; steps continuous: {d['steps_continuous']}; "
                   f"{d['fail_stops']} fail-stops ({d['rollbacks']} rolled back, {d['lost_steps']} steps lost in all, "
                   f"none beyond the design: {not d['losses_beyond_design']}); median live downtime "
                   f"{min(live):.3f}-{max(live):.3f} s by kind; all checks: {'pass' if d['ok'] else 'FAIL'}.")
        replays = d.get("restart_replays")
        if replays is not None:
            out[-1] += (f" Restart replays of {len(replays)} recoveries ("
                        + ", ".join(f"{_recovery_kind(r)} {r['old']} -> {r['new']} at step {r['restored_step']}"
                                    for r in replays)
                        + f"): {sum(r['equal'] for r in replays)} equal bit for bit over the "
                        f"{sum(r['steps_compared'] for r in replays)} steps after them.")
    return out


def _sim_validation(d: dict[str, Any]) -> list[str]:
    s, floor = d["summary"], d["noise_floor_same_event_twice"]
    across = d.get("noise_floor_same_event_other_run") or {}
    parts = [f"{q.removesuffix('_s').replace('_', ' ')} median {v['median_abs_error']:.1%}, worst "
             f"{v['worst_abs_error']:.0%} ({v['events']} events; the same event measured twice differs by "
             f"{floor[q]:.1%})" for q, v in s.items()]
    out = ["leave-one-out over the H200 handoffs: " + "; ".join(parts) + "."]
    if across:
        out.append("The same handoff in two runs (different sessions) differs by: " + ", ".join(
            f"{q.removesuffix('_s').replace('_', ' ')} {v:.0%}" for q, v in across.items() if v is not None)
            + " (median; save and load: the restart's largest parts).")
    st = d.get("steps")
    if st and st["held_out"]["steps"]:
        two = "; ".join(f"{r['model']} {r['parallel']} ({r['run']}) {r['measured_s']:.2f} s measured, "
                        f"{r['simulated_s']:.2f} s simulated" for r in st["rows"] if not r["in_fit"])
        out.append(f"Steps on two GPUs, held out (the fit sees one-GPU steps only): median "
                   f"{st['held_out']['median_abs_error']:.1%}, worst {st['held_out']['worst_abs_error']:.1%} over "
                   f"{st['held_out']['steps']}: {two}.")
    held = d.get("held_out_live")
    if held:
        hs = held["summary"]
        out.append(f"Held out, {', '.join(held['sources'])} (live only, not in the fit; "
                   f"{len(held['handoffs_not_in_the_fit'])} of its {held['handoffs']} handoffs of configurations "
                   "no fitted event has): " + "; ".join(
                       f"{q.removesuffix('_s').replace('_', ' ')} median {v['median_abs_error']:.1%} over "
                       f"{v['events']} events, {v['pooled_median_abs_error']:.1%} over the {v['handoffs']} handoffs "
                       f"with their repeats pooled (worst {v['pooled_worst_abs_error']:.0%})" for q, v in hs.items())
                   + ".")
    h = d.get("held_out_dcp")
    if h:
        rows = "; ".join(f"{r['model']} to {r['dir']} ({r['source']}): save {r['save_s']['measured']:.1f} s measured, "
                         f"{r['save_s']['simulated']:.1f} s simulated; load {r['load_s']['measured']:.1f} s, "
                         f"{r['load_s']['simulated']:.1f} s" for r in h["dcp"])
        steps = "; ".join(f"{r['model']} ({r['source']}) {r['measured']:.2f} s measured, {r['simulated']:.2f} s simulated"
                          for r in h["steps"] if r["preset_shape"])
        beyond = "; ".join(f"hidden {r['hidden_size']}, {r['params'] / 1e9:.2f}B: {r['measured']:.3f} s measured, "
                           f"{r['simulated']:.3f} s simulated" for r in h["steps"] if not r["preset_shape"])
        b = h["steps_beyond_the_presets"]
        out.append("Held out, DCP of one rank's whole state measured directly on one H200 (two sessions, and shapes "
                   f"beyond the presets) "
                   f"({', '.join(h['sources'])}): {rows} "
                   f"(median error: save {h['median_abs_error']['save_s']:.0%}, load "
                   f"{h['median_abs_error']['load_s']:.0%}; against each run's first save and load, which a "
                   f"restart pays: {h['median_abs_error']['first_save_s']:.0%} and "
                   f"{h['median_abs_error']['first_load_s']:.0%}). One-GPU steps of the fitted shapes: {steps}."
                   + (f" Held out, one-GPU steps of shapes beyond the presets: {beyond} (median error "
                      f"{b['median_abs_error']:.1%}, worst {b['worst_abs_error']:.0%})." if beyond else ""))
    return out


def _sim_downtime(d: dict[str, Any]) -> list[str]:
    rows = [r for r in d["rows"] if r.get("live_downtime_s") is not None and r["gpus"] in (64, 1024)]
    parts = [f"{r['model']} on {r['gpus']} ({r['profile']}): live {r['live_downtime_s']:.2f} s, restart "
             f"{r['restart_downtime_s']:.0f} s" for r in rows if r["model"] in ("70b", "175b", "70b-cluster", "175b-cluster")]
    g = d["goal_70b_1024_h200"]
    out = ["; ".join(parts) + f". Goal (70B, 1,024 H200-class GPUs, live at most {g['goal_s']:g} s): "
           + ("met" if g["met"] else "not met") + "."]
    r = d.get("goal_70b_h200_over_the_range")
    if r:  # (every count of whole nodes from 64 to 1,024, not only powers of two)
        spread = {(x["profile"], x["model"]): x for x in d["spread"]}
        lines = [f"{m} ({p}): live {s['live_downtime_s']['min']:.2f}-{s['live_downtime_s']['max']:.2f} s "
                 f"(median {s['live_downtime_s']['median']:.2f}), restart {s['restart_downtime_s']['min']:.0f}-"
                 f"{s['restart_downtime_s']['max']:.0f} s"
                 for (p, m), s in spread.items() if m in ("70b-cluster", "175b-cluster") and s["live_downtime_s"]]
        miss = r["missed_at_gpus"]
        out.append(f"Over every count of whole nodes from 64 to 1,024 GPUs ({r['counts']} counts): " + "; ".join(lines)
                   + f". The goal's 1.5 s for 70B on H200-class GPUs: met at {r['met_at']} of {r['counts']} counts"
                   + (f"; missed at {', '.join(map(str, miss[:12]))}{' ...' if len(miss) > 12 else ''} GPUs (worst "
                      f"{r['worst_live_downtime_s']:.2f} s)" if miss else "") + "."
                   + _why_missed(r.get("why_missed") or {}))
    return out


def _why_missed(why: dict[str, Any]) -> str:
    """Where the goal's misses were a choice: a configuration under it existed, its step slower."""
    under = [w["under_goal"] for w in why.values() if w["under_goal"] is not None]
    if not why or len(under) < len(why):
        return ""
    pauses, slower = [u["pause_s"] for u in under], [u["step_slower"] for u in under]
    return (f" At each miss a configuration under the goal existed (pauses {min(pauses):.2f}-{max(pauses):.2f} s),"
            f" its step {100 * min(slower):.1f}-{100 * max(slower):.1f}% slower: over the choice's 10-minute horizon"
            f" that costs more than the longer pause, so the target takes the pause.")


def _sim_goodput(d: dict[str, Any]) -> list[str]:
    out = []
    for prof in dict.fromkeys(r["profile"] for r in d["rows"]):
        for regime in ("every 10 min", "bamboo p3", "bamboo g4dn"):
            rs = {r["policy"]: r for r in d["rows"] if r["profile"] == prof and r["regime"] == regime}
            if rs:
                out.append(f"{prof}, {regime}: " + ", ".join(f"{p} {r['goodput']:.1%} (samples {r['efficiency']:.1%})"
                                                              for p, r in rs.items()))
    goals = "; ".join(
        f"{prof} {g['goodput']:.2%} ({'met' if g['met'] else 'not met'}; the rest: downtime {g['lost_to']['downtime']:.2%}, "
        f"slower steps {g['lost_to']['slower_steps']:.3%}, rolled back {g['lost_to']['rolled_back']:.2%}; "
        f"{g['transfer_share_of_downtime']:.0%} of the downtime is the transfer)"
        for prof, g in d["goal_10min"].items() if "lost_to" in g)
    return [f"{d['model']}, {d['gpus']} GPUs, {d['hours']:g} h, notice {d['notice_s']} s: " + "; ".join(out) + "."] + (
        [f"Goal, live goodput of 99.5% at an event every 10 minutes: {goals}."] if goals else [])


def _sim_speed(d: dict[str, Any]) -> list[str]:
    return [f"an {d['hours']} h trace ({d['changes']} changes, {d['gpus_at_peak']} GPUs at its peak, {d['model']}) "
            f"in {d['cpu_s']:.1f} s of one core's CPU (goal: {d['goal_s']:g} s)."]


def _cpu_target(d: dict[str, Any]) -> list[str]:
    rows = d["rows"]
    worst = max(rows, key=lambda r: r["chosen_over_fastest"])
    return [f"{d['cases']} cases (two model shapes, {min(r['processes'] for r in rows)} to "
            f"{max(r['processes'] for r in rows)} processes, every valid configuration timed): the controller's "
            f"choice within 10% of the fastest measured in {d['within_10pct']}; worst {d['worst_ratio']:.2f}x "
            f"({worst['shape']}, {worst['processes']} processes: {worst['chosen']} against {worst['fastest']})."]


def _native_overhead(d: dict[str, Any]) -> list[str]:
    med, mfu = d["median_step_s"], d["mfu"]
    return [f"{d['model']} ({d['compute_dtype']}, {d['tokens_per_step']:,} tokens a step) on {d['device']}, torch "
            f"{d['torch']}: the recipe's loop plain {med['plain'] * 1e3:.1f} ms, under LiveR {med['liver'] * 1e3:.1f} ms "
            f"a step: {_pct(d['overhead'])}{_ci(d['overhead_ci95'])} ({d['rounds']} runs of each, interleaved, "
            f"{d['steps'] - d['warmup'] - 1} steps timed each); MFU {mfu['plain']:.1%} plain, {mfu['liver']:.1%} "
            f"under LiveR."]


def _build(rows: list[dict[str, Any]]) -> list[str]:
    def extra(r: dict[str, Any], way: str) -> str:
        x = r[f"{way}_first_extra_s"]
        return "no step (out of memory)" if x is None else f"{max(0.0, x) * 1e3:.0f} ms"
    return [f"{r['model']} {r['parallel']} on {r['device']}: left in the switch, native {r['native_at_switch_s'] * 1e3:.0f} ms "
            f"with nothing made before, {r['native_structure_s'] * 1e3:.0f} ms with its model laid out before, "
            f"{r['native_s'] * 1e3:.1f} ms made whole before (Prepare: {r['native_prebuild_s'] * 1e3:.0f} ms); "
            f"reference {r['reference_s'] * 1e3:.1f} ms: {r['ratio']:.2f}x; the first step's extra, native "
            f"{extra(r, 'native')}, reference {extra(r, 'reference')}" for r in rows]


def _engines_reconfig(rows: list[dict[str, Any]]) -> list[str]:
    return [f"{r['scenario']}: live downtime, a user's model {r['native_median_s'] * 1e3:.0f} ms, the reference engine "
            f"{r['reference_median_s'] * 1e3:.0f} ms: {r['ratio']:.1f}x (median of {len(r['native_live_s'])} each)"
            for r in rows]


def _precopy(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for change in dict.fromkeys(r["change"] for r in rows):
        parts = []
        for size in dict.fromkeys(r["size"] for r in rows if r["change"] == change):
            off, on = (next(r for r in rows if r["change"] == change and r["size"] == size and r["precopy"] is p)
                       for p in (False, True))
            parts.append(f"{size} ({on['parameters'] / 1e6:.1f}M parameters): pause {off['downtime_median_s'] * 1e3:.0f} ms "
                         f"without, {on['downtime_median_s'] * 1e3:.0f} ms with (middle 90%: "
                         f"{on['downtime_interval_s'][0] * 1e3:.0f}-{on['downtime_interval_s'][1] * 1e3:.0f} ms), "
                         f"the switch in it {off['switch_median_s'] * 1e3:.1f} ms without, "
                         f"{on['switch_median_s'] * 1e3:.1f} ms with, "
                         f"{on['bytes_precopied'] / 2**20:.1f} MiB pre-copied, "
                         f"{on['bytes_streamed_at_switch'] / 2**20:.1f} MiB moved in the switch; mirroring "
                         f"{_pct(on['mirror_overhead'])} on {on['mirrored_steps_median']:g} step(s), "
                         f"{on['mirror_extra_median_s'] * 1e3:.0f} ms in all")
        n = min(r["events"] for r in rows if r["change"] == change)
        out.append(f"{change} ({n} events each): " + "; ".join(parts) + ".")
    same = all(r["digest_equal"] for r in rows)
    return out + [f"State digests before and after every switch: {'equal' if same else 'NOT all equal'}."]


def _sim_precopy(d: dict[str, Any]) -> list[str]:
    out = [f"{r['model']} on {r['gpus']} ({r['profile']}, {r['old']} -> {r['new']}, steps of {r['step_s']:.0f} s): "
           f"pause {r['pause_s']:.2f} s without, {r['pause_precopy_s']:.2f} s with; mirroring costs the steps "
           f"{r['mirror_cost_s']:.2f} s: {r['lost_s']:.2f} s lost to the event without, {r['lost_precopy_s']:.2f} s with"
           for r in d["rows"]]
    gp = d["goodput"]
    goods = "; ".join(f"{r['profile']} {r['model']}: live {r['goodput']:.2%}, live-precopy {q['goodput']:.2%} (goal "
                      f"{r['goal']:.1%}: {'met' if q['goodput'] >= r['goal'] else 'not met'} with it)"
                      for r in gp if r["policy"] == "live"
                      for q in gp if q["policy"] == "live-precopy" and (q["profile"], q["model"]) == (r["profile"], r["model"]))
    return [o + "." for o in out] + [f"Goodput, one event every 10 minutes for 8 hours: {goods}."]


RENDER: dict[str, Callable[[Any], list[str]]] = {
    "precopy": _precopy, "sim_precopy": _sim_precopy,
    "native_overhead": _native_overhead, "build": _build, "engines_reconfig": _engines_reconfig,
    "cpu_target": _cpu_target,
    "sim_validation": _sim_validation, "sim_downtime": _sim_downtime, "sim_goodput": _sim_goodput,
    "sim_speed": _sim_speed,
    "heal": _heal, "vs_torchft": _vs_torchft, "join_vs_torchft": _join_vs_torchft, "soak": _soak,
    "compat": _compat, "native_compat": _native_compat, "dcp": _dcp, "nodes": _nodes,
    "handoffs": _handoffs, "overhead": _overhead, "transfer": _transfer, "cpu_reconfig": _cpu_reconfig,
    "boot": _boot, "core_binding": _core_binding, "plan": _plan, "plan_pickle": _plan_pickle}


def render(root: Path = ROOT) -> str:
    results = root / "bench" / "results"
    claims = tomllib.loads((results / "claims.toml").read_text())["claim"]
    out = [BEGIN, ""]
    for c in claims:
        data = json.loads((results / c["folder"] / c["file"]).read_text())
        out.append(f"- **{c['title']}** (`bench/results/{c['folder']}`, commit {c['commit']}):")
        out += [f"  {line}" for line in RENDER[c["kind"]](data)]
    out += ["", "Each folder's command and machine: `bench/results/claims.toml`.", END]
    return "\n".join(out)


def run(write: bool, root: Path = ROOT) -> bool:
    """True if the README's section is current (after writing it, with ``write``)."""
    readme = root / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme}: no section between {BEGIN!r} and {END!r}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = head + render(root) + tail
    if write and new != text:
        readme.write_text(new)
        return True
    return new == text
