//! A TCP delay line: the store "another host away" on a kernel without
//! netem. Every connection accepted on `--listen` is joined to `--to`,
//! and every chunk read on one side is written to the other `--delay`
//! after it was read, in order, in each direction (so a round trip costs
//! twice the delay). Bandwidth is not limited.
//!
//! Each direction of each connection has a reader thread and a writer
//! thread: std's sleep wakes within tens of microseconds, where tokio's
//! timer wheel rounds every sleep up to a whole millisecond, too coarse for
//! a 0.25 ms delay. The delay can change while running (`--delay-file`,
//! re-read every 100 ms: a store that slows down mid-run); a chunk keeps
//! the delay in force when it was read. Every `--report` seconds, and at
//! the end, it prints the CPU time it used (its cost belongs to neither
//! side of the benchmark).
//!
//! ```text
//! delay-line --listen 127.0.0.1:15432 --to 127.0.0.1:5432 --delay 1ms [--delay-file F] [--report 10]
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod cpu;
mod settings;
mod timer_slack;

use settings::Settings;

/// Largest chunk read at once.
const CHUNK: usize = 64 * 1024;

fn main() {
    timer_slack::tighten();
    let settings = match Settings::from_args(std::env::args().skip(1)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("delay-line: {e}\n{}", settings::USAGE);
            std::process::exit(2);
        }
    };
    let listener = TcpListener::bind(settings.listen).unwrap_or_else(|e| {
        eprintln!("delay-line: cannot listen on {}: {e}", settings.listen);
        std::process::exit(1);
    });
    let delay = Arc::new(AtomicU64::new(nanos(settings.delay)));
    if let Some(path) = settings.delay_file.clone() {
        settings::follow(path, Arc::clone(&delay));
    }
    if let Some(every) = settings.report {
        cpu::report_every(every);
    }
    // The bound address, for a caller that asked for port 0.
    println!("listening {}", listener.local_addr().expect("bound"));
    for stream in listener.incoming() {
        match stream {
            Ok(client) => {
                let delay = Arc::clone(&delay);
                let to = settings.to;
                std::thread::spawn(move || join(client, to, delay));
            }
            Err(e) => eprintln!("delay-line: accept: {e}"),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Join one accepted connection to the target, both ways delayed.
fn join(client: TcpStream, to: SocketAddr, delay: Arc<AtomicU64>) {
    let server = match TcpStream::connect(to) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("delay-line: cannot connect to {to}: {e}");
            return;
        }
    };
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
    }
    let pairs = [
        (client.try_clone(), server.try_clone()),
        (server.try_clone(), client.try_clone()),
    ];
    for (from, into) in pairs {
        match (from, into) {
            (Ok(from), Ok(into)) => direction(from, into, Arc::clone(&delay)),
            _ => eprintln!("delay-line: cannot share a socket between threads"),
        }
    }
}

/// One direction: a reader stamping each chunk with when it is due, and a
/// writer sending it then. End of stream or an error is passed on as a
/// half-close once everything before it was written.
fn direction(mut from: TcpStream, mut into: TcpStream, delay: Arc<AtomicU64>) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let after = Duration::from_nanos(delay.load(Ordering::Relaxed));
                    if chunks
                        .send((Instant::now() + after, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        let _ = from.shutdown(Shutdown::Read);
    });
    std::thread::spawn(move || {
        for (at, bytes) in due {
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if into.write_all(&bytes).is_err() {
                let _ = into.shutdown(Shutdown::Both);
                return;
            }
        }
        let _ = into.shutdown(Shutdown::Write);
    });
}
