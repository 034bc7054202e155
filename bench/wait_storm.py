#!/usr/bin/env python3
"""Same-key storms with `concurrent = "wait"`: the waiters' latency against
the first request's, and the store operations per request.

    python3 bench/wait_storm.py --gateway 127.0.0.1:8080 --admin 127.0.0.1:9090 \
        [--sizes 8,32,64] [--delay-ms 1000] [--rounds 5] [--path /v1/payments]

The gateway must route PATH to an upstream that honours `?delay_ms=N` (the
repository's demo upstream does) with `concurrent = "wait"`. Each round
fires SIZE requests with one new key at once over SIZE connections, and
reads `idemgate_store_duration_seconds_count{op="claim"}` from the admin
listener before and after, so store claims per request are measured, not
assumed. Prints one Markdown table row per size: the first request's
latency, the waiters' median and max, how many were replays, and claims per
request. Standard library only.
"""

import argparse
import asyncio
import re
import statistics
import time
import uuid


async def post(host, port, path, key):
    """One keyed POST over its own connection; returns (status, replayed, seconds)."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    body = b'{"amount": 700}'
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    answer = await reader.read()
    elapsed = time.perf_counter() - started
    writer.close()
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    status = int(head.split(" ", 2)[1])
    replayed = "idempotent-replayed: true" in head.lower()
    return status, replayed, elapsed


def claims(admin):
    """The claim count from the admin listener's metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"http://{admin}/metrics").read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("idemgate_store_duration_seconds_count{") and 'op="claim"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def storm(args, size):
    host, port = args.gateway.rsplit(":", 1)
    path = f"{args.path}?delay_ms={args.delay_ms}"
    key = f"storm-{uuid.uuid4()}"
    before = claims(args.admin)
    first = asyncio.create_task(post(host, int(port), path, key))
    await asyncio.sleep(0.05)
    rest = [asyncio.create_task(post(host, int(port), path, key)) for _ in range(size - 1)]
    first = await first
    rest = await asyncio.gather(*rest)
    after = claims(args.admin)
    return first, rest, (after - before) / size


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gateway", default="127.0.0.1:8080")
    p.add_argument("--admin", default="127.0.0.1:9090")
    p.add_argument("--path", default="/v1/payments")
    p.add_argument("--sizes", default="8,32,64")
    p.add_argument("--delay-ms", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    print(f"upstream delay {args.delay_ms} ms, {args.rounds} rounds per size\n")
    print("| requests per key | first request (s) | waiters: median (s) | waiters: max (s) | 2xx | replayed | store claims per request |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in [int(s) for s in args.sizes.split(",")]:
        firsts, waits, ok, replays, per = [], [], 0, 0, []
        for _ in range(args.rounds):
            first, rest, claims_per = await storm(args, size)
            firsts.append(first[2])
            waits += [r[2] for r in rest]
            ok += sum(1 for r in [first, *rest] if 200 <= r[0] < 300)
            replays += sum(1 for r in rest if r[1])
            per.append(claims_per)
        n = size * args.rounds
        print(
            f"| {size} | {statistics.median(firsts):.3f} | {statistics.median(waits):.3f} | "
            f"{max(waits):.3f} | {ok}/{n} | {replays}/{n - args.rounds} | {statistics.median(per):.2f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
