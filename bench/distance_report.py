"""Part distance's results (bench/distance.sh): one table per delay, the
issue's goals marked met or not.

    python3 bench/distance_report.py WORK OUT DURATION REPEATS COMMIT DELAYS C CEIL_C PEER_VERSION

Reads WORK/dist_raw ("NAME c rps p50_ms p99_ms non2xx cpu_us_per_req", NAME
"dist-<delay>-<row>"), WORK/dist_ping ("dist-<delay> avg p50 p99", ms) and
WORK/dist_lines ("dist-<delay> cpu_s wall_s": both delay lines) and
WORK/dist_batches (the PostgreSQL gateway's batches and batched operations
before and after the new-key rows).
"""

import collections
import datetime
import statistics
import sys

work, out, duration, repeats, commit, delays, conc, ceil_c, peer = sys.argv[1:]
delays, conc, ceil_c = delays.split(), int(conc), int(ceil_c)

rows = collections.defaultdict(list)
for line in open(f"{work}/dist_raw"):
    name, c, rps, p50, p99, non2xx, cpu = line.split()
    rows[name].append((float(rps), p50, p99, non2xx, cpu))
ping = collections.defaultdict(list)
for line in open(f"{work}/dist_ping"):
    f = line.split()
    if len(f) == 4:
        ping[f[0]].append([float(x) for x in f[1:]])
batches = {}  # "dist-<delay> batches ops batches ops": the PostgreSQL gateway's, before and after the new-key rows
try:
    for line in open(f"{work}/dist_batches"):
        f = line.split()
        if len(f) == 5:
            batches[f[0]] = (int(f[3]) - int(f[1]), int(f[4]) - int(f[2]))
except FileNotFoundError:
    pass
lines = {}
for line in open(f"{work}/dist_lines"):
    d, cpu, wall = line.split()
    lines[d] = (float(cpu), float(wall))


def med(name, i=0):
    vals = [float(r[i]) for r in rows.get(name, []) if r[i] != "-"]
    return statistics.median(vals) if vals else None


def rate(name):
    vals = [r[0] for r in rows.get(name, [])]
    if not vals:
        return "—"
    return f"{statistics.median(vals):,.0f} ({min(vals):,.0f}–{max(vals):,.0f})"


def non2xx(name):
    return sum(int(r[3]) for r in rows.get(name, []))


def fmt(x, spec=".2f"):
    return "—" if x is None else format(x, spec)


L = [f"# idemgate benchmark: the store at a distance — {datetime.date.today()}", "",
     f"Commit {commit}. `ONLY=distance bash bench/run.sh` (bench/distance.sh). 2 cores shared by everything:",
     "wrk, nginx, PostgreSQL, Redis, the gateways, the peer and the two delay lines (bench/delay-line), whose",
     "CPU is reported below. Every client of a store reaches it through its delay line: the gateways, pgbench,",
     "redis-benchmark and the peer. The delay is each way; RTT is a PING through the line (one connection).",
     f"{duration} s per run, {repeats} runs per cell, rows of one delay interleaved; throughput at c = {conc}",
     f"(wrk -t2), ceilings with {ceil_c} clients (the gateways' pool_size: as many store connections);",
     "requests/s as median (min–max); `first` rows: one connection,",
     "one request at a time. 512-byte JSON POST to an nginx static 201; gateways with RUST_LOG=warn, pool_size = 32."]
if peer:
    L.append(f"Peer: idempotent-proxy-server {peer} on the same Redis line (POLL_INTERVAL=10).")

goals = []
for delay in delays:
    d = f"dist-{delay}"
    p = ping.get(d)
    rtt = statistics.median(x[1] for x in p) if p else None
    L += ["", f"## {delay} each way (RTT p50 {fmt(rtt, '.3f')} ms)", "",
          "| row | requests/s | p50 ms | p99 ms | non-2xx | gateway CPU µs/req |", "|---|---|---|---|---|---|"]
    for row in ["new-postgres", "new-redis", "new-front", "new-peer",
                "hot-postgres", "hot-postgres-nocache", "hot-redis", "hot-redis-nocache", "hot-peer",
                "first-pass", "first-postgres", "first-redis", "first-front", "first-peer", "first-pg-plain-pair",
                "ceil-pg-plain-pair", "ceil-pg-claim-complete", "ceil-redis-claim", "ceil-redis-complete"]:
        n = f"{d}-{row}"
        if n in rows:
            L.append(f"| {row} | {rate(n)} | {fmt(med(n, 1))} | {fmt(med(n, 2))} | {non2xx(n) if not row.startswith('ceil') else '—'} | "
                     f"{fmt(med(n, 4), '.1f')} |")
    # Redis runs one script at a time and a client waits for each: claim then
    # complete cost the sum of their times, 1 / (1/claim + 1/complete).
    a, b = med(f"{d}-ceil-redis-claim"), med(f"{d}-ceil-redis-complete")
    pair = 1 / (1 / a + 1 / b) if a and b else None
    if pair:
        L.append(f"| ceil-redis-claim+complete | {pair:,.0f} | | | | |")
    if batches.get(d, (0, 0))[0]:
        b, o = batches[d]
        L += ["", f"PostgreSQL gateway during the new-key rows: {b:,} batches, {o:,} claims and completions, "
                  f"{o / b:.1f} per batch."]
    if d in lines:
        cpu, wall = lines[d]
        L += ["", f"Delay lines: {cpu:.1f} s CPU over {wall:.0f} s ({100 * cpu / wall:.0f} % of one core)."]
    base = med(f"{d}-first-pass", 1)
    L += ["", "What a first request adds over a pass-through (p50, one connection):"]
    pair1 = med(f"{d}-first-pg-plain-pair", 1)
    if pair1 is not None:
        L.append(f"- (pgbench's plain pair from one client, mean: {pair1:.2f} ms = {pair1 / rtt:.1f} RTT: two round trips and two commits)")
    for store in ["postgres", "redis", "front", "peer"]:
        x = med(f"{d}-first-{store}", 1)
        if x is not None and base is not None and rtt is not None:
            added, limit = x - base, 2 * rtt + 1
            L.append(f"- {store}: {added:.2f} ms = {added / rtt:.1f} RTT" + (
                f" (goal ≤ 2 RTT + 1 ms = {limit:.2f} ms: {'met' if added <= limit else 'missed'})" if store != "peer" else ""))
            if store != "peer":
                goals.append((f"{delay}: first request on {store} adds ≤ 2 RTT + 1 ms", f"{added:.2f} ms ≤ {limit:.2f} ms", added <= limit))
            # PostgreSQL commits twice (claim, record) on top of the round
            # trips: the plain pair from one client costs the same two;
            # the front adds its Redis read, one round trip.
            if store in ("postgres", "front") and pair1 is not None:
                own = pair1 + 1 + (rtt if store == "front" else 0)
                what = "the plain pair" + (" + 1 RTT" if store == "front" else "") + " + 1 ms"
                goals.append((f"{delay}: first request on {store} adds ≤ {what}", f"{added:.2f} ms ≤ {own:.2f} ms", added <= own))
    pg, plain = med(f"{d}-new-postgres"), med(f"{d}-ceil-pg-plain-pair")
    if pg and plain:
        goals.append((f"{delay}: new keys, PostgreSQL ÷ pgbench plain pair ≥ 2", f"{pg / plain:.2f}", pg / plain >= 2))
    peer_new, peer_hot = med(f"{d}-new-peer"), med(f"{d}-hot-peer")
    for store in ["postgres", "redis", "front"]:
        x = med(f"{d}-new-{store}")
        if x and peer_new:
            goals.append((f"{delay}: new keys, {store} ahead of the peer", f"{x:,.0f} vs {peer_new:,.0f}", x > peer_new))
    for row in ["hot-postgres", "hot-postgres-nocache", "hot-redis", "hot-redis-nocache"]:
        x = med(f"{d}-{row}")
        if x and peer_hot:
            goals.append((f"{delay}: replays, {row[4:]} ahead of the peer", f"{x:,.0f} vs {peer_hot:,.0f}", x > peer_hot))
    if pair and med(f"{d}-new-redis"):
        L.append(f"- new keys, Redis ÷ the claim+complete script pair: {med(f'{d}-new-redis') / pair:.2f}")
    if pg and plain:
        L.append(f"- new keys, PostgreSQL ÷ the plain pair: {pg / plain:.2f}; "
                 f"÷ idemgate's own claim + complete statements: {pg / med(f'{d}-ceil-pg-claim-complete'):.2f}")

L += ["", "## Goals", "", "| goal | measured | |", "|---|---|---|"]
L += [f"| {g} | {m} | {'met' if ok else '**missed**'} |" for g, m, ok in goals]
L.append("")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
