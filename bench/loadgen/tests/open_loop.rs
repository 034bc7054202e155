//! The generator measured from outside, against a small HTTP/1.1 server
//! started by each test on port 0: it sends the rate asked for; it keeps
//! sending at that rate while every answer stalls (and a closed loop, the
//! negative control, does not); it counts busy connections as overruns,
//! 503s with and without Retry-After apart, resets as resets and silence
//! as timeouts; and a new rate in the rate file applies while it runs.
//! The bounds leave room for a busy 2-core machine (CI runs these one at
//! a time).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How the test server answers.
#[derive(Clone, Copy)]
enum Answer {
    /// `201` after this long.
    Created(Duration),
    /// `503`, with `Retry-After` when the key's number is even.
    Unavailable,
    /// Close the connection with the request unread: a reset.
    Reset,
}

/// What the server saw and sent.
#[derive(Default)]
struct Seen {
    arrivals: Mutex<Vec<Instant>>,
    retry_after: AtomicU64,
    bare: AtomicU64,
}

fn serve(answer: Answer) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let shared = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let seen = Arc::clone(&shared);
            std::thread::spawn(move || connection(stream, answer, &seen));
        }
    });
    (addr, seen)
}

fn connection(mut stream: TcpStream, answer: Answer, seen: &Seen) {
    if let Answer::Reset = answer {
        // The request in the socket's receive buffer, unread: closing now
        // sends a RST.
        std::thread::sleep(Duration::from_millis(20));
        let mut some = [0u8; 8];
        let _ = stream.read(&mut some);
        return;
    }
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let (mut length, mut key) = (0usize, String::new());
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        seen.arrivals.lock().unwrap().push(Instant::now());
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            if let Some(v) = lower.strip_prefix("idempotency-key:") {
                key = v.trim().to_string();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let reply = match answer {
            Answer::Created(stall) => {
                std::thread::sleep(stall);
                "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}".to_string()
            }
            Answer::Unavailable => {
                let n: u64 = key.rsplit('-').next().unwrap().parse().unwrap();
                if n.is_multiple_of(2) {
                    seen.retry_after.fetch_add(1, Ordering::Relaxed);
                    "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"
                        .to_string()
                } else {
                    seen.bare.fetch_add(1, Ordering::Relaxed);
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".to_string()
                }
            }
            Answer::Reset => unreachable!(),
        };
        if stream.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// Run the generator against `addr` with `args` (split at spaces); its
/// summary.
fn loadgen(addr: SocketAddr, args: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["--url", &format!("http://{addr}/v1/payments"), "--json"])
        .args(args.split_whitespace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["type"], "summary", "{stdout}");
    let seconds = stdout.lines().filter(|l| l.contains(r#""type":"second""#));
    let per_second: u64 = seconds
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["scheduled"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(per_second, summary["scheduled"], "the seconds add up");
    summary
}

fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {v}"))
}

/// Arrivals per 100 ms window over `span` from the first, or why they
/// are not within 35 % of `rate`/10 in every window (the first and the
/// last are left out: the run starts and stops inside them).
fn steady(arrivals: &[Instant], rate: f64, span: Duration) -> Result<(), String> {
    let first = *arrivals.first().ok_or("no arrivals")?;
    let windows = (span.as_millis() / 100) as usize;
    let mut counts = vec![0u32; windows];
    for a in arrivals {
        if let Some(c) = counts.get_mut((a.duration_since(first).as_millis() / 100) as usize) {
            *c += 1;
        }
    }
    let want = rate / 10.0;
    let inner = &counts[1..windows - 1];
    if inner
        .iter()
        .all(|&c| (f64::from(c) - want).abs() <= 0.35 * want)
    {
        Ok(())
    } else {
        Err(format!("arrivals per 100 ms {counts:?}, want {want} each"))
    }
}

#[test]
fn it_sends_the_rate_asked_for() {
    let (addr, seen) = serve(Answer::Created(Duration::ZERO));
    let s = loadgen(addr, "--rate 500 --duration 1");
    let arrived = seen.arrivals.lock().unwrap().len() as u64;
    assert!(
        (475..=525).contains(&arrived),
        "{arrived} arrived at 500/s for 1 s"
    );
    assert_eq!(n(&s, "sent"), arrived);
    assert_eq!(n(&s["classes"], "2xx"), arrived);
    assert_eq!(s["rate_kept"], true, "{s}");
    let p50 = s["latency_ms"]["2xx"]["p50"].as_f64().unwrap();
    assert!(p50 < 50.0, "{s}");
}

#[test]
fn stalled_answers_do_not_slow_the_arrivals_but_a_closed_loop_does() {
    let stall = Duration::from_millis(300);
    let (addr, seen) = serve(Answer::Created(stall));
    let s = loadgen(addr, "--rate 200 --duration 1");
    let arrivals = seen.arrivals.lock().unwrap().clone();
    steady(&arrivals, 200.0, Duration::from_secs(1)).unwrap();
    let latency = &s["latency_ms"]["2xx"];
    assert!(
        latency["p50"].as_f64().unwrap() >= 300.0,
        "the stall counts: {s}"
    );
    assert!(latency["p99"].as_f64().unwrap() < 600.0, "no queueing: {s}");
    assert_eq!(n(&s, "overrun"), 0);

    // The control: a closed loop of 10 connections, as wrk runs, sends
    // 10 requests a stall at most; the same check must see it.
    let (addr, seen) = serve(Answer::Created(stall));
    loadgen(
        addr,
        "--rate 200 --duration 1 --connections-max 10 --closed-loop",
    );
    let arrivals = seen.arrivals.lock().unwrap().clone();
    assert!(
        steady(&arrivals, 200.0, Duration::from_secs(1)).is_err(),
        "a closed loop passed the open-loop check"
    );
}

#[test]
fn busy_connections_are_overruns_not_waited_for() {
    let (addr, seen) = serve(Answer::Created(Duration::from_millis(300)));
    let s = loadgen(addr, "--rate 200 --duration 1 --connections-max 10");
    let scheduled = n(&s, "scheduled");
    assert!((190..=210).contains(&scheduled), "{s}");
    assert_eq!(n(&s, "sent") + n(&s, "overrun"), scheduled);
    assert!(n(&s, "overrun") >= 120, "10 connections, 300 ms each: {s}");
    assert_eq!(n(&s, "sent"), seen.arrivals.lock().unwrap().len() as u64);
}

#[test]
fn unavailable_with_and_without_retry_after_are_counted_apart() {
    let (addr, seen) = serve(Answer::Unavailable);
    let log = std::env::temp_dir().join(format!("loadgen-log-{}", std::process::id()));
    let s = loadgen(
        addr,
        &format!("--rate 200 --duration 0.5 --log {}", log.display()),
    );
    let with = seen.retry_after.load(Ordering::Relaxed);
    let bare = seen.bare.load(Ordering::Relaxed);
    assert!(with > 20 && bare > 20, "{with} {bare}");
    assert_eq!(n(&s, "503_retry_after"), with);
    assert_eq!(n(&s, "503_without_retry_after"), bare);
    assert_eq!(n(&s["status"], "503"), with + bare);
    assert_eq!(s["latency_ms"]["503"]["n"], with + bare);
    assert_eq!(n(&s["classes"], "2xx"), 0);
    // The log: a line per request, by due instant, the same split.
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(log);
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len() as u64, n(&s, "scheduled"));
    let result = |r: &str| lines.iter().filter(|l| l[2] == r).count() as u64;
    assert_eq!((result("503ra"), result("503")), (with, bare));
    let due: Vec<f64> = lines.iter().map(|l| l[0].parse().unwrap()).collect();
    assert!(due.windows(2).all(|w| w[0] <= w[1]) && due[due.len() - 1] < 0.5);
}

#[test]
fn resets_are_counted_as_resets_not_answers() {
    let (addr, _) = serve(Answer::Reset);
    let s = loadgen(addr, "--rate 100 --duration 0.5");
    assert!(n(&s, "scheduled") >= 45, "{s}");
    assert_eq!(n(&s, "resets"), n(&s, "scheduled"), "{s}");
    assert_eq!(n(&s, "answered"), 0);
    assert_eq!(n(&s, "errors") + n(&s, "timeouts"), 0);
}

#[test]
fn silence_is_a_timeout() {
    let (addr, _) = serve(Answer::Created(Duration::from_secs(2)));
    let s = loadgen(addr, "--rate 50 --duration 0.4 --timeout 200ms");
    assert!(n(&s, "scheduled") >= 18, "{s}");
    assert_eq!(n(&s, "timeouts"), n(&s, "scheduled"), "{s}");
    assert_eq!(n(&s, "answered"), 0);
}

#[test]
fn a_new_rate_in_the_rate_file_applies_while_running() {
    let file = std::env::temp_dir().join(format!("loadgen-rate-{}", std::process::id()));
    std::fs::write(&file, "100").unwrap();
    let (addr, seen) = serve(Answer::Created(Duration::ZERO));
    let path = file.clone();
    let raise = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        std::fs::write(&path, "400").unwrap();
    });
    let s = loadgen(
        addr,
        &format!("--rate 100 --duration 1.2 --rate-file {}", file.display()),
    );
    raise.join().unwrap();
    let _ = std::fs::remove_file(file);
    let arrivals = seen.arrivals.lock().unwrap().clone();
    let first = arrivals[0];
    let within = |from: u64, to: u64| {
        let range = Duration::from_millis(from)..Duration::from_millis(to);
        arrivals
            .iter()
            .filter(|a| range.contains(&a.duration_since(first)))
            .count()
    };
    let (before, after) = (within(0, 400), within(800, 1200));
    assert!(
        (30..=50).contains(&before),
        "{before} in the first 400 ms at 100/s"
    );
    assert!(
        (120..=200).contains(&after),
        "{after} in the last 400 ms at 400/s: {s}"
    );
}
