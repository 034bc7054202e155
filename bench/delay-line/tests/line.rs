//! The delay line measured from outside: round trips through it to an
//! echo server cost twice the delay (and nothing measurable without one,
//! the control that shows the measure can tell), bytes arrive in order,
//! and a new delay in the delay file applies while running. The bounds
//! leave room for a busy 2-core machine (CI runs these one at a time).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An echo server on a free port.
fn echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// The line in front of `to`, and the address it listens on.
struct Line(Child, SocketAddr);

impl Line {
    fn start(to: SocketAddr, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_delay-line"))
            .args(["--listen", "127.0.0.1:0", "--to", &to.to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let addr = first
            .trim()
            .strip_prefix("listening ")
            .unwrap()
            .parse()
            .unwrap();
        Self(child, addr)
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The median of 21 one-byte round trips.
fn round_trip(addr: SocketAddr) -> Duration {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut times: Vec<Duration> = (0..21)
        .map(|_| {
            let started = Instant::now();
            s.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            started.elapsed()
        })
        .collect();
    times.sort();
    times[10]
}

#[test]
fn a_round_trip_costs_twice_the_delay() {
    let to = echo();
    let plain = Line::start(to, &["--delay", "0"]);
    let none = round_trip(plain.1);
    assert!(none < Duration::from_millis(1), "no delay, yet {none:?}");
    let line = Line::start(to, &["--delay", "1ms"]);
    let rtt = round_trip(line.1);
    assert!(rtt >= Duration::from_millis(2), "{rtt:?}");
    assert!(rtt < Duration::from_millis(5), "{rtt:?}");
    let fine = Line::start(to, &["--delay", "250us"]);
    let rtt = round_trip(fine.1);
    assert!(rtt >= Duration::from_micros(500), "{rtt:?}");
    assert!(rtt < Duration::from_micros(2500), "{rtt:?}");
}

#[test]
fn bytes_arrive_in_order() {
    let line = Line::start(echo(), &["--delay", "250us"]);
    let sent: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut s = TcpStream::connect(line.1).unwrap();
    let mut writer = s.try_clone().unwrap();
    let data = sent.clone();
    let pusher = std::thread::spawn(move || writer.write_all(&data).unwrap());
    let mut got = vec![0u8; sent.len()];
    s.read_exact(&mut got).unwrap();
    pusher.join().unwrap();
    assert!(got == sent, "the echoed bytes differ");
}

#[test]
fn the_delay_file_changes_the_delay_while_running() {
    let file = std::env::temp_dir().join(format!("delay-line-{}", std::process::id()));
    std::fs::write(&file, "1ms").unwrap();
    let line = Line::start(
        echo(),
        &["--delay", "1ms", "--delay-file", file.to_str().unwrap()],
    );
    assert!(round_trip(line.1) < Duration::from_millis(5));
    std::fs::write(&file, "10ms").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let slow = round_trip(line.1);
    assert!(slow >= Duration::from_millis(20), "{slow:?}");
    let _ = std::fs::remove_file(file);
}
