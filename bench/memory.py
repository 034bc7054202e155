#!/usr/bin/env python3
"""Memory use of idemgate: idle connections and the HTTP/2 body attack.

Usage (from the repository root, after `cargo build --release --locked` and
`cargo build --release --bin demo_upstream`; `pip install h2`):

    nice -n 10 python3 bench/memory.py [--only idle-h1,idle-h1-long,idle-h1-8k,idle-tcp,idle-h2,attack-1,attack-2,attack-10,attack-repeat]

It starts the demo upstream and, per scenario, a fresh gateway on free
loopback ports with `[store] url = "memory://"`, and reads VmRSS from
/proc/PID/status. Results are printed as Markdown tables on stdout.
Environment: IDEMGATE (binary), UPSTREAM (demo_upstream binary),
STEPS (default "1000,5000,10000").
"""

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
IDEMGATE = os.environ.get("IDEMGATE", os.path.join(TARGET, "release", "idemgate"))
UPSTREAM = os.environ.get("UPSTREAM", os.path.join(TARGET, "release", "demo_upstream"))
STEPS = [int(s) for s in os.environ.get("STEPS", "1000,5000,10000").split(",")]
MIB = 1024 * 1024
# Seconds between the last connection of a step and the RSS reading. Longer
# than the gateway's PARK_AFTER (1 s, src/server/h1.rs): an HTTP/1.1
# connection keeps its hyper state for that long after its response, and is
# parked (without it) only then.
SETTLE = 2


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def sockets(pid):
    """Sockets the process holds (listeners, upstream pool and client connections)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


def still_open(socks):
    """How many of these client sockets the gateway has not closed."""
    n = 0
    for s in socks:
        s.setblocking(False)
        try:
            n += s.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            n += 1
        except OSError:
            pass
        s.setblocking(True)
    return n


def mib(b):
    return f"{b / MIB:.1f}"


def wait_port(port, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"port {port} never opened")


class Gateway:
    def __init__(self, upstream_port, **overrides):
        self.port = free_port()
        self.admin = free_port()
        top = {
            "max_connections": "20000",
            "idle_timeout": '"10m"',
            "header_read_timeout": '"10s"',
        }
        top.update({k: v for k, v in overrides.items()})
        self.dir = tempfile.mkdtemp(prefix="idemgate-mem-")
        self.conf = os.path.join(self.dir, "gateway.toml")
        lines = [f'listen = "127.0.0.1:{self.port}"', f'admin_listen = "127.0.0.1:{self.admin}"']
        lines += [f"{k} = {v}" for k, v in top.items()]
        lines += ["", "[store]", 'url = "memory://"', "",
                  "[[routes]]", 'name = "payments"', 'match = "/v1/payments/*"',
                  f'upstream = "http://127.0.0.1:{upstream_port}"', ""]
        self.config_text = "\n".join(lines)
        with open(self.conf, "w") as f:
            f.write(self.config_text)
        env = dict(os.environ, RUST_LOG="warn")
        self.log = open(os.path.join(self.dir, "stderr.log"), "w")
        self.proc = subprocess.Popen([IDEMGATE, "--config", self.conf, "serve"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        wait_port(self.port)
        wait_port(self.admin)
        time.sleep(0.5)

    def rss(self):
        return rss(self.proc.pid)

    def healthz(self):
        t = time.time()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/healthz", timeout=5) as r:
                code = r.status
        except Exception as e:  # noqa: BLE001
            code = f"error {e}"
        return code, (time.time() - t) * 1000

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------- HTTP/1.1 idle

def h1_request(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /v1/payments/pay_0 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            raise RuntimeError("closed before the answer")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(rest) < length:
        rest += s.recv(4096)
    return s, status


def tcp_only(port):
    """Connected, nothing sent: what an accepted connection costs before hyper reads a request."""
    return socket.create_connection(("127.0.0.1", port), timeout=10), "none"


def h2_request(port):
    import h2.config
    import h2.connection
    import h2.events
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    c = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    c.send_headers(1, [(":method", "GET"), (":path", "/v1/payments/pay_0"),
                       (":scheme", "http"), (":authority", "127.0.0.1")], end_stream=True)
    s.sendall(c.data_to_send())
    status = None
    done = False
    while not done:
        data = s.recv(65536)
        if not data:
            raise RuntimeError("closed before the answer")
        for ev in c.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = int(dict(ev.headers)[b":status"])
            elif isinstance(ev, h2.events.StreamEnded):
                done = True
            elif isinstance(ev, h2.events.DataReceived):
                c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        out = c.data_to_send()
        if out:
            s.sendall(out)
    return (s, c), status


def idle(upstream_port, proto, label, **overrides):
    gw = Gateway(upstream_port, **overrides)
    rows = []
    conns = []
    statuses = {}
    try:
        base = gw.rss()
        base_socks = sockets(gw.proc.pid)
        rows.append((0, base, None, base_socks, 0))
        raw = lambda: [c[0] if proto == "h2" else c for c in conns]  # noqa: E731
        fn = {"h1": h1_request, "h2": h2_request, "tcp": tcp_only}[proto]
        for n in STEPS:
            t = time.time()
            while len(conns) < n:
                c, st = fn(gw.port)
                statuses[st] = statuses.get(st, 0) + 1
                conns.append(c)
            took = time.time() - t
            time.sleep(SETTLE)
            r = gw.rss()
            rows.append((n, r, took, sockets(gw.proc.pid), still_open(raw())))
        health = gw.healthz()
        time.sleep(15)
        later = (gw.rss(), sockets(gw.proc.pid), still_open(raw()))
    finally:
        for c in conns:
            (c[0] if proto == "h2" else c).close()
        gw.stop()
    print(f"\n### {label}\n")
    print("```toml\n" + gw.config_text + "```\n")
    print(f"answers: {statuses}; /healthz after the last step: {health[0]} in {health[1]:.1f} ms; "
          f"15 s later: VmRSS {mib(later[0])} MiB, gateway sockets {later[1]}, "
          f"client connections still open {later[2]}\n")
    print("| connections opened | still open (client side) | gateway sockets | VmRSS MiB | Δ vs baseline MiB | bytes / open connection | open time s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, r, took, socks, alive in rows:
        per = f"{(r - base) / alive:,.0f}" if alive else "–"
        print(f"| {n} | {alive} | {socks} | {mib(r)} | {mib(r - base)} | {per} | {'' if took is None else f'{took:.1f}'} |")
    sys.stdout.flush()


# ---------------------------------------------------------------- HTTP/2 attack

class Attacker(threading.Thread):
    """One HTTP/2 connection: `streams` keyed POSTs of content-length 1 MiB that
    each send `partial` bytes of body and then stall."""

    def __init__(self, port, idx, streams, partial, stalled_evt_list):
        super().__init__(daemon=True)
        self.port, self.idx, self.streams, self.partial = port, idx, streams, partial
        self.stalled = threading.Event()
        self.finish = threading.Event()
        self.refused = 0
        self.other_reset = {}
        self.statuses = {}
        self.sent = {}
        self.answer_times = []
        self.goaway = None
        self.error = None

    def run(self):
        try:
            self._run()
        except Exception as e:  # noqa: BLE001
            self.error = repr(e)
            self.stalled.set()

    def _run(self):
        import h2.config
        import h2.connection
        import h2.errors
        import h2.events
        s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        c = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
        c.initiate_connection()
        ids = []
        # All HEADERS go out before the server's SETTINGS is read, as an attacker
        # would: the client library then does not cap them at the server's limit.
        for i in range(self.streams):
            sid = c.get_next_available_stream_id()
            c.send_headers(sid, [(":method", "POST"), (":path", "/v1/payments/attack"),
                                 (":scheme", "http"), (":authority", "127.0.0.1"),
                                 ("idempotency-key", f"c{self.idx}-k{i}"),
                                 ("content-type", "application/octet-stream"),
                                 ("content-length", str(1048576))])
            ids.append(sid)
            self.sent[sid] = 0
        s.sendall(c.data_to_send())
        closed = set()
        chunk = b"x" * 16384
        s.settimeout(0.2)
        self.start_t = time.time()
        deadline = time.time() + 20
        while True:
            # send what the windows allow, up to `partial` per stream
            progressed = False
            for sid in ids:
                if sid in closed or self.sent[sid] >= self.partial:
                    continue
                try:
                    w = min(c.local_flow_control_window(sid), c.max_outbound_frame_size,
                            self.partial - self.sent[sid])
                except Exception:  # noqa: BLE001  (stream closed/reset)
                    closed.add(sid)
                    continue
                if w > 0:
                    c.send_data(sid, chunk[:w])
                    self.sent[sid] += w
                    progressed = True
            out = c.data_to_send()
            if out:
                s.sendall(out)
            pending = [sid for sid in ids if sid not in closed and self.sent[sid] < self.partial]
            if not pending and not self.stalled.is_set():
                self.stalled_t = time.time()
                self.stalled.set()
            if time.time() > deadline and not self.stalled.is_set():
                self.stalled_t = time.time()
                self.stalled.set()  # windows never opened for the rest: stalled anyway
            if self.finish.is_set():
                break
            if progressed:
                # do not block on recv while there is still window to use
                s.settimeout(0.001)
            else:
                s.settimeout(0.2)
            try:
                data = s.recv(1 << 20)
            except (socket.timeout, BlockingIOError):
                continue
            if not data:
                break
            for ev in c.receive_data(data):
                if isinstance(ev, h2.events.StreamReset):
                    closed.add(ev.stream_id)
                    if ev.error_code == h2.errors.ErrorCodes.REFUSED_STREAM:
                        self.refused += 1
                    else:
                        k = str(ev.error_code)
                        self.other_reset[k] = self.other_reset.get(k, 0) + 1
                elif isinstance(ev, h2.events.ResponseReceived):
                    st = int(dict(ev.headers)[b":status"])
                    self.statuses[st] = self.statuses.get(st, 0) + 1
                    self.answer_times.append((st, time.time() - self.start_t))
                    closed.add(ev.stream_id)
                elif isinstance(ev, h2.events.DataReceived):
                    c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    self.goaway = str(ev.error_code)
            out = c.data_to_send()
            if out:
                s.sendall(out)
        s.close()


def attack(upstream_port, nconn, streams=200, partial=64 * 1024, **overrides):
    over = {"body_read_timeout": '"5s"'}
    over.update(overrides)
    gw = Gateway(upstream_port, **over)
    try:
        before = gw.rss()
        ths = [Attacker(gw.port, i, streams, partial, None) for i in range(nconn)]
        for t in ths:
            t.start()
        for t in ths:
            t.stalled.wait(30)
        time.sleep(0.3)
        stalled_rss = gw.rss()
        health_during = gw.healthz()
        # sample the peak until everything has been answered (body_read_timeout)
        peak = stalled_rss
        t0 = time.time()
        while time.time() - t0 < 12:
            peak = max(peak, gw.rss())
            time.sleep(0.2)
        after = gw.rss()
        health_after = gw.healthz()
        for t in ths:
            t.finish.set()
        for t in ths:
            t.join(5)
        time.sleep(1)
        closed_rss = gw.rss()
    finally:
        gw.stop()
    tot = lambda f: sum(f(t) for t in ths)  # noqa: E731
    accepted = tot(lambda t: len(t.sent)) - tot(lambda t: t.refused)
    statuses = {}
    for t in ths:
        for k, v in t.statuses.items():
            statuses[k] = statuses.get(k, 0) + v
    body_sent = tot(lambda t: sum(t.sent.values()))
    times = sorted(x for t in ths for st, x in t.answer_times if st == 408)
    others = {}
    for t in ths:
        for k, v in t.other_reset.items():
            others[k] = others.get(k, 0) + v
    errors = [t.error for t in ths if t.error]
    return {
        "conns": nconn, "streams": nconn * streams, "refused": tot(lambda t: t.refused),
        "accepted": accepted, "other_reset": others, "statuses": statuses,
        "body_sent": body_sent, "before": before, "stalled": stalled_rss, "peak": peak,
        "after": after, "closed": closed_rss, "health_during": health_during,
        "health_after": health_after, "408_at": (times[0], times[-1]) if times else None,
        "goaway": [t.goaway for t in ths if t.goaway], "errors": errors,
        "config": gw.config_text,
    }


def attack_repeated(upstream_port, rounds=5, nconn=2):
    """The same attack again and again on one gateway: does RSS keep growing?"""
    gw = Gateway(upstream_port, body_read_timeout='"5s"')
    out = [gw.rss()]
    try:
        for r in range(rounds):
            ths = [Attacker(gw.port, 100 * r + i, 200, 64 * 1024, None) for i in range(nconn)]
            for t in ths:
                t.start()
            for t in ths:
                t.stalled.wait(30)
            time.sleep(6.5)  # past body_read_timeout: every accepted stream has its 408
            for t in ths:
                t.finish.set()
            for t in ths:
                t.join(5)
            time.sleep(1)
            out.append(gw.rss())
    finally:
        gw.stop()
    print(f"\n### The attack with {nconn} connections repeated {rounds} times on one gateway\n")
    print("VmRSS MiB before and after each round: " + " → ".join(mib(x) for x in out))
    sys.stdout.flush()


def print_attacks(results):
    print("\n### HTTP/2 body attack (200 streams per connection, 64 KiB of a 1 MiB body each, then stall)\n")
    print("```toml\n" + results[0]["config"] + "```\n")
    print("| connections | streams opened | refused (REFUSED_STREAM) | accepted | answers | body bytes the client got to send | RSS before MiB | RSS stalled MiB | peak MiB | RSS after the 408s MiB | RSS after closing MiB | 408s at (s after start) | /healthz during |")
    print("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        at = f"{r['408_at'][0]:.1f}–{r['408_at'][1]:.1f}" if r["408_at"] else "–"
        print(f"| {r['conns']} | {r['streams']} | {r['refused']} | {r['accepted']} | {r['statuses']} "
              f"| {mib(r['body_sent'])} MiB | {mib(r['before'])} | {mib(r['stalled'])} | {mib(r['peak'])} "
              f"| {mib(r['after'])} | {mib(r['closed'])} | {at} | {r['health_during'][0]} in {r['health_during'][1]:.0f} ms |")
        if r["other_reset"] or r["goaway"] or r["errors"]:
            print(f"\n({r['conns']} connection(s): other RST_STREAM codes {r['other_reset']} (0 = NO_ERROR, sent after an early answer), goaway {r['goaway']}, client errors {r['errors']})\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="idle-h1,idle-h1-long,idle-h1-8k,idle-tcp,idle-h2,attack-1,attack-2,attack-10,attack-repeat")
    args = ap.parse_args()
    only = args.only.split(",")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(20000, hard), hard))
    up_port = free_port()
    up = subprocess.Popen([UPSTREAM, "--listen", f"127.0.0.1:{up_port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(up_port)
        print(f"idemgate: {IDEMGATE}\nRLIMIT_NOFILE: {resource.getrlimit(resource.RLIMIT_NOFILE)}")
        if "idle-h1" in only:
            idle(up_port, "h1", "Idle HTTP/1.1 keep-alive connections (one GET each, answered by the upstream), defaults otherwise")
        if "idle-h1-long" in only:
            idle(up_port, "h1", "Idle HTTP/1.1 connections, header_read_timeout = 10m",
                 header_read_timeout='"10m"')
        if "idle-h1-8k" in only:
            idle(up_port, "h1", "Idle HTTP/1.1 connections, header_read_timeout = 10m, max_header_bytes = 8KiB",
                 header_read_timeout='"10m"', max_header_bytes='"8KiB"')
        if "idle-tcp" in only:
            idle(up_port, "tcp", "Connections that sent nothing yet, header_read_timeout = 10m",
                 header_read_timeout='"10m"')
        if "idle-h2" in only:
            idle(up_port, "h2", "Idle HTTP/2 (prior-knowledge h2c) connections, one GET each; keep-alive pings pushed out to 10m so unanswered pings do not close them",
                 http2_keep_alive_interval='"10m"', http2_keep_alive_timeout='"10m"')
        res = []
        for n in (1, 2, 10):
            if f"attack-{n}" in only:
                res.append(attack(up_port, n))
        if res:
            print_attacks(res)
        if "attack-repeat" in only:
            attack_repeated(up_port)
    finally:
        up.terminate()
        up.wait()


if __name__ == "__main__":
    main()
