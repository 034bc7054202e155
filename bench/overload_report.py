"""Part overload's results (bench/overload.sh): past capacity, the issue's
goals marked met or missed.

    python3 bench/overload_report.py OV OUT DURATION RECOVER COMMIT LEVELS C SLOW_DELAY TIMEOUT
    python3 bench/overload_report.py --line LOADGEN_JSON    (one line about one run, for the log)

Reads, in OV: peak and peak-slow (wrk_once: "rps p50_ms p99_ms non2xx
requests socket_errors"); for each run NAME (level-<x>, slow): NAME.json
(loadgen --json: a line per second, then the summary), NAME.log (loadgen
--log: "due_s latency_ms result" per request), NAME.steps ("unix_s file
value": when the rate or the delay changed), NAME.rss ("unix_s VmRSS_KiB"
every 100 ms), NAME.gw ("cpu_s VmHWM_KiB" of the gateway); slow.line (the
delay line's CPU).
"""

import datetime
import json
import os
import sys

# A phase's accepted p99 and its 503s' p99 may be at most this many times
# the p99 at the peak (the bound for the accepted; "fast" for a
# rejection is held to the same).
P99_FACTOR = 3.0
GOODPUT_SHARE = 0.9
RECOVERY_S = 1.0
# Memory is bounded when the second half of an overloaded phase peaks no
# higher than this times the first half's peak (plus 4 MiB of noise; the
# phase's first second, while connections open, left out).
RSS_GROWTH = 1.1


def summary(path):
    return json.loads(open(path).read().splitlines()[-1])


if sys.argv[1] == "--line":
    s = summary(sys.argv[2])
    p99 = s["latency_ms"]["2xx"].get("p99", "-")
    print(f"offered {s['offered_per_s']:.0f}/s goodput {s['goodput_per_s']:.0f}/s 2xx p99 {p99} ms, "
          f"503 {s['status'].get('503', 0)} ({s['503_retry_after']} with Retry-After), timeouts {s['timeouts']}, "
          f"resets {s['resets']}, overrun {s['overrun']}, rate kept {s['rate_kept']}, loadgen cpu {s['cpu_s']:.1f} s")
    sys.exit(0)

ov, out, duration, recover, commit, levels, conc, slow_delay, timeout = sys.argv[1:]
duration, recover, levels = float(duration), float(recover), levels.split()


def wrk(name):
    f = open(f"{ov}/{name}").read().split()
    return {"rps": float(f[0]), "p50": float(f[1]), "p99": float(f[2]), "non2xx": int(f[3]),
            "errors": int(f[5])}


def requests(name):
    rows = []
    for line in open(f"{ov}/{name}.log"):
        due, latency, result = line.split()
        rows.append((float(due), float(latency), result))
    return rows


def steps(name, started):
    """Offsets from the run's first due instant of each change."""
    return [float(line.split()[0]) - started for line in open(f"{ov}/{name}.steps") if line.strip()]


def pct(sorted_values, q):
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def phase(rows, a, b):
    """What the requests due in [a, b) got."""
    got = [r for r in rows if a <= r[0] < b]
    ok = sorted(r[1] for r in got if r[2].startswith("2"))
    unavailable = sorted(r[1] for r in got if r[2] in ("503", "503ra"))
    counts = {}
    for r in got:
        kind = r[2] if not r[2].startswith("2") else "2xx"
        counts[kind] = counts.get(kind, 0) + 1
    span = max(b - a, 1e-9)
    return {
        "n": len(got), "offered": len(got) / span, "goodput": len(ok) / span,
        "p50": pct(ok, 0.5), "p99": pct(ok, 0.99), "max": ok[-1] if ok else None,
        "u_p99": pct(unavailable, 0.99), "counts": counts,
    }


def rejected(p):
    """Requests sent and not answered 2xx (overruns are the client's)."""
    return sum(n for k, n in p["counts"].items() if k not in ("2xx", "overrun"))


def recovery(rows, at, ref_p99):
    """Seconds from `at` to the last request due after it that was not a
    2xx within the bound (0: none); None if bad ones reach the run's end."""
    bound = P99_FACTOR * ref_p99
    after = [r for r in rows if r[0] >= at]
    if not after:
        return None
    bad = [r[0] for r in after if not r[2].startswith("2") or r[1] > bound]
    if not bad:
        return 0.0
    end = after[-1][0]
    if bad[-1] >= end - 0.5:
        return None
    return bad[-1] - at


def samples(name, started):
    """(offset_s, VmRSS_KiB, forwards_in_flight or None) every 100 ms."""
    out = []
    for line in open(f"{ov}/{name}.rss"):
        f = line.split()
        if len(f) == 3 and f[1].isdigit():
            out.append((float(f[0]) - started, int(f[1]), int(float(f[2])) if f[2] != "-" else None))
    return out


def rss(name, started, a, b):
    """Peak VmRSS (KiB) over the run, and in the first and second halves of
    [a, b), the first second left out (connections still opening)."""
    got = samples(name, started)
    a = min(a + 1.0, (a + b) / 2)
    mid = (a + b) / 2
    first = [k for t, k, _ in got if a <= t < mid]
    second = [k for t, k, _ in got if mid <= t < b]
    every = [k for _, k, _ in got]
    return (max(every) if every else None, max(first) if first else None, max(second) if second else None)


def in_flight(name, started, a, b):
    """The most forwards in flight the gateway reported in [a, b)."""
    got = [f for t, _, f in samples(name, started) if a <= t < b and f is not None]
    return max(got) if got else None


def gw(name):
    cpu, hwm = open(f"{ov}/{name}.gw").read().split()
    return float(cpu), int(hwm)


def outcomes(name):
    """The gateway's requests by outcome over the run (idemgate_requests_total)."""
    seen = {"before": {}, "after": {}}
    for line in open(f"{ov}/{name}.outcomes"):
        when, outcome, n = line.split()
        seen[when][outcome] = int(n)
    return {k: n - seen["before"].get(k, 0) for k, n in seen["after"].items()}


def did(name, s):
    """A row of what the gateway did in run `name` (loadgen summary `s`)."""
    o = outcomes(name)
    got = s["classes"]["2xx"]
    other = sum(n for k, n in o.items() if k not in ("forwarded", "overloaded", "store_error"))
    return (f"| {name} | {o.get('forwarded', 0):,} | {got:,} | {max(0, o.get('forwarded', 0) - got):,} | "
            f"{o.get('overloaded', 0):,} | {o.get('store_error', 0):,} | {other:,} |")


DID_HEAD = ["", "What the gateway did (`idemgate_requests_total` by outcome, over each run and the 2 s after it):",
            "*forwarded for nobody* is forwarded minus the 2xx the client received: requests claimed, forwarded",
            "and recorded after their client had timed out and gone (G6: from the claim on, a client that leaves",
            "changes nothing).", "",
            "| run | forwarded | 2xx received | forwarded for nobody | 503 overloaded | 503 store_error | other |",
            "|---|---|---|---|---|---|---|"]


def ms(x):
    return "—" if x is None else f"{x:.1f}"


def mark(ok):
    return "**met**" if ok else "**missed**"


def got_text(p):
    c = p["counts"]
    parts = [f"{k} {n}" for k, n in sorted(c.items()) if k != "2xx"]
    return ", ".join(parts) if parts else "nothing else"


peak = wrk("peak")
ref = peak["p99"]
L = [f"# idemgate benchmark: past capacity — {datetime.date.today()}", "",
     f"Commit {commit}. `ONLY=overload bash bench/run.sh` (bench/overload.sh). 2 cores shared by everything:",
     "the load generator, the gateway, PostgreSQL (the bench's throwaway cluster) and the nginx upstream.",
     f"New keys only (a fresh `Idempotency-Key` per request, 512-byte JSON POST). The peak is wrk's closed loop",
     f"at c = {conc} for {duration:.0f} s; every other figure is bench/loadgen's open loop (request i due at",
     f"t0 + i/R, latency from that instant, client timeout {timeout}), {duration:.0f} s per level, then 0.5 × the",
     f"peak for {recover:.0f} s. A request is *rejected* when it is sent and not answered 2xx.", "",
     f"Peak: **{peak['rps']:,.0f} new keys/s**, p50 {peak['p50']:.2f} ms, p99 **{ref:.2f} ms** (the reference;",
     f"non-2xx {peak['non2xx']}, socket errors {peak['errors']}).", "",
     "| load | offered/s | goodput/s | of peak | 2xx p50 ms | 2xx p99 ms | rejected: what they got | 503 p99 ms | recovery s | forwards in flight, most | gateway CPU s | RSS peak MiB | loadgen CPU s |",
     "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
goals = []
limited = []
for level in levels:
    name = f"level-{level}"
    s = summary(f"{ov}/{name}.json")
    started = s["started_unix_s"]
    rows = requests(name)
    drop = (steps(name, started) or [duration])[0]
    load, after = phase(rows, 0.0, drop), phase(rows, drop, drop + recover)
    rec = recovery(rows, drop, ref)
    cpu, hwm = gw(name)
    top, first, second = rss(name, started, 0.0, drop)
    L.append(f"| {level} × | {load['offered']:,.0f} | {load['goodput']:,.0f} | {load['goodput'] / peak['rps']:.2f} | "
             f"{ms(load['p50'])} | {ms(load['p99'])} | {got_text(load)} | {ms(load['u_p99'])} | "
             f"{'> ' + f'{recover - 0.5:.1f}' if rec is None else f'{rec:.2f}'} | "
             f"{in_flight(name, started, 0.0, drop) or '—'} | {cpu:.1f} | "
             f"{(top or 0) / 1024:.0f} (VmHWM {hwm / 1024:.0f}) | {s['cpu_s']:.1f} |")
    L.append(f"| then 0.5 × | {after['offered']:,.0f} | {after['goodput']:,.0f} | | {ms(after['p50'])} | "
             f"{ms(after['p99'])} | {got_text(after)} | {ms(after['u_p99'])} | | "
             f"{in_flight(name, started, drop, drop + recover) or '—'} | | | |")
    if not s["rate_kept"] or s["overrun"]:
        limited.append(f"{level} ×: the generator fell behind (late {s['late']}, {s['behind_ms']['max']} ms at most) "
                       f"or ran out of connections (overrun {s['overrun']}): its load was lower than asked")
    rej = rejected(load)
    c = load["counts"]
    fast_503 = rej == c.get("503ra", 0) and (load["u_p99"] is None or load["u_p99"] <= P99_FACTOR * ref)
    bounded = first is not None and second is not None and second <= RSS_GROWTH * first + 4096
    goals.append((level, [
        (f"goodput ≥ {GOODPUT_SHARE:.0%} of the peak", load["goodput"] >= GOODPUT_SHARE * peak["rps"],
         f"{load['goodput']:,.0f}/s = {load['goodput'] / peak['rps']:.2f} × {peak['rps']:,.0f}"),
        (f"accepted p99 ≤ {P99_FACTOR:.0f} × the peak's ({P99_FACTOR * ref:.1f} ms)",
         load["p99"] is not None and load["p99"] <= P99_FACTOR * ref, f"{ms(load['p99'])} ms"),
        (f"every rejection a fast 503 with Retry-After (503 p99 ≤ {P99_FACTOR * ref:.1f} ms)", fast_503,
         f"{rej} rejected: {got_text(load)}; 503 p99 {ms(load['u_p99'])} ms"),
        (f"memory bounded (second half's RSS peak ≤ {RSS_GROWTH} × the first's)", bounded,
         f"{(first or 0) / 1024:.0f} MiB then {(second or 0) / 1024:.0f} MiB"),
        (f"recovery within {RECOVERY_S:.0f} s of the drop to 0.5 ×", rec is not None and rec <= RECOVERY_S,
         "never, in the run" if rec is None else f"{rec:.2f} s"),
    ]))

L += DID_HEAD + [did(f"level-{level}", summary(f"{ov}/level-{level}.json")) for level in levels]

slow = None
if os.path.exists(f"{ov}/slow.json"):
    s = summary(f"{ov}/slow.json")
    started = s["started_unix_s"]
    rows = requests("slow")
    marks = steps("slow", started)
    slowed, sped = (marks + [duration, 2 * duration])[:2]
    speak = wrk("peak-slow")
    parts = [("1 ms", phase(rows, 0.0, slowed)), (slow_delay, phase(rows, slowed, sped)),
             ("1 ms again", phase(rows, sped, sped + recover))]
    cpu, hwm = gw("slow")
    line_cpu = open(f"{ov}/slow.line").read().split()[1]
    rec = recovery(rows, sped, speak["p99"])
    top, first, second = rss("slow", started, slowed, sped)
    L += ["", f"## The store slowing down: a delay line to PostgreSQL, 1 ms → {slow_delay} → 1 ms each way", "",
          f"A second gateway whose store is behind bench/delay-line; its own peak through the line at 1 ms:",
          f"{speak['rps']:,.0f} new keys/s, p99 {speak['p99']:.2f} ms (wrk, c = {conc}). loadgen at that rate throughout;",
          f"the delay rose to {slow_delay} after {slowed:.1f} s and fell back after {sped:.1f} s. Gateway CPU {cpu:.1f} s,",
          f"RSS peak {(top or 0) / 1024:.0f} MiB (VmHWM {hwm / 1024:.0f}), the delay line's CPU {float(line_cpu):.1f} s,",
          f"loadgen's {s['cpu_s']:.1f} s.", "",
          "| delay | offered/s | goodput/s | 2xx p50 ms | 2xx p99 ms | rejected: what they got | 503 p99 ms | forwards in flight, most |",
          "|---|---|---|---|---|---|---|---|"]
    bounds = [0.0, slowed, sped, sped + recover]
    for (label, p), a, b in zip(parts, bounds, bounds[1:]):
        L.append(f"| {label} | {p['offered']:,.0f} | {p['goodput']:,.0f} | {ms(p['p50'])} | {ms(p['p99'])} | "
                 f"{got_text(p)} | {ms(p['u_p99'])} | {in_flight('slow', started, a, b) or '—'} |")
    L += DID_HEAD + [did("slow", s)]
    if not s["rate_kept"] or s["overrun"]:
        limited.append(f"slow store: the generator fell behind (late {s['late']}) or ran out of connections "
                       f"(overrun {s['overrun']})")
    p = parts[1][1]
    c = p["counts"]
    rej = rejected(p)
    bound = P99_FACTOR * speak["p99"]
    bounded = first is not None and second is not None and second <= RSS_GROWTH * first + 4096
    slow = [
        ("sheds rather than queues: no timeouts, no resets", c.get("timeout", 0) + c.get("reset", 0) == 0,
         f"timeouts {c.get('timeout', 0)}, resets {c.get('reset', 0)} of {p['n']}"),
        (f"every rejection a fast 503 with Retry-After (503 p99 ≤ {bound:.1f} ms)",
         rej == c.get("503ra", 0) and (p["u_p99"] is None or p["u_p99"] <= bound),
         f"{rej} rejected: {got_text(p)}; 503 p99 {ms(p['u_p99'])} ms"),
        ("memory bounded while slow", bounded, f"{(first or 0) / 1024:.0f} MiB then {(second or 0) / 1024:.0f} MiB"),
        (f"recovery within {RECOVERY_S:.0f} s of the store speeding up", rec is not None and rec <= RECOVERY_S,
         "never, in the run" if rec is None else f"{rec:.2f} s"),
    ]

L += ["", "## Goals (issue 47, section 2)", ""]
for level, gs in goals:
    L.append(f"At {level} × the peak:")
    for what, ok, how in gs:
        L.append(f"- {what}: {mark(ok)} ({how})")
    L.append("")
if slow:
    L.append(f"The store slowing down ({slow_delay} each way):")
    for what, ok, how in slow:
        L.append(f"- {what}: {mark(ok)} ({how})")
    L.append("")
if limited:
    L += ["Runs the generator limited (their figures understate the load):", ""]
    L += [f"- {x}" for x in limited]
    L.append("")
L += ["Rules: goodput is the 2xx answers to requests due in the phase, per second of the phase; p99 of the",
      "accepted is over those 2xx; recovery is the time from the drop to the last request due after it that",
      f"was not a 2xx within {P99_FACTOR:.0f} × the peak's p99 (the rate file is re-read every 100 ms, so up to",
      "0.1 s of it is the generator's); memory, VmRSS sampled every 100 ms by the script, VmHWM at the end;",
      "forwards in flight, `idemgate_forwards_in_flight` sampled as often: claimed forwards only; the",
      "`max_forwards_in_flight` budget also holds the claims still waiting for the store, which no metric shows."]

os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
open(out, "w").write("\n".join(L) + "\n")
