//! A TCP fault proxy between the gateways and the upstream (kernel fault
//! injection, `tc` or iptables, is not available here). It copies bytes
//! both ways and, per chunk read, may instead:
//! - reset the connection before the request reaches the upstream,
//! - let the upstream act, then reset instead of passing its answer back,
//! - hang: stop copying (before or after the upstream acted) and keep the
//!   connection open until the gateway gives up.
//!
//! Rare faults happen at random all the time; the nemesis switches the whole
//! proxy to "hang everything" or "reset everything" for a while.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the whole proxy does to new chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Pass bytes, with rare random faults.
    Normal = 0,
    /// Hang every exchange (an upstream that stopped answering).
    HangAll = 1,
    /// Reset every connection (an upstream that crashes on every request).
    ResetAll = 2,
    /// No faults at all (faults cleared, for the final check).
    Calm = 3,
    /// Refuse new connections (the listening socket is closed) and reset
    /// open ones: an upstream that is down, so nothing is sent (the
    /// gateway releases the key).
    Refuse = 4,
}

/// Random fault rates per chunk in [`Mode::Normal`].
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    pub reset_before: f64,
    pub reset_after: f64,
    pub hang_before: f64,
    pub hang_after: f64,
    /// Chunks each connection carries untouched first (its handshake: a
    /// gateway starting up is not what the faults are about).
    pub grace_chunks: u32,
}

/// How many faults the proxy injected.
#[derive(Debug, Default)]
pub struct Counters {
    pub connections: AtomicU64,
    pub reset_before: AtomicU64,
    pub reset_after: AtomicU64,
    pub hang_before: AtomicU64,
    pub hang_after: AtomicU64,
}

struct Shared {
    target: SocketAddr,
    mode: AtomicU8,
    rates: Rates,
    rng: Mutex<fastrand::Rng>,
    counters: Counters,
    /// When each fault was injected (a lost store reply can cost a lease
    /// renewal: the checker's property 8 needs to know when).
    fault_times: Mutex<Vec<std::time::Instant>>,
}

/// A running fault proxy.
pub struct FaultProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(target: SocketAddr, rates: Rates, seed: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            target,
            mode: AtomicU8::new(Mode::Normal as u8),
            rates,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            counters: Counters::default(),
            fault_times: Mutex::new(Vec::new()),
        });
        let state = shared.clone();
        let task = tokio::spawn(async move {
            let mut listener = Some(listener);
            loop {
                if state.mode() == Mode::Refuse {
                    // Closed: connects are refused until the mode changes.
                    listener = None;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
                let open = match &listener {
                    Some(open) => open,
                    None => match TcpListener::bind(addr).await {
                        Ok(open) => listener.insert(open),
                        Err(_) => {
                            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                            continue;
                        }
                    },
                };
                let accepted =
                    tokio::time::timeout(std::time::Duration::from_millis(50), open.accept()).await;
                let Ok(Ok((client, _))) = accepted else {
                    continue;
                };
                state.counters.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(pump(client, state.clone()));
            }
        });
        Self { addr, shared, task }
    }

    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// When each fault was injected.
    pub fn fault_times(&self) -> Vec<std::time::Instant> {
        self.shared.fault_times.lock().unwrap().clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What to do with one chunk.
enum Fault {
    None,
    Reset,
    Hang,
}

impl Shared {
    fn mode(&self) -> Mode {
        match self.mode.load(Ordering::SeqCst) {
            1 => Mode::HangAll,
            2 => Mode::ResetAll,
            3 => Mode::Calm,
            4 => Mode::Refuse,
            _ => Mode::Normal,
        }
    }

    /// Decide the fate of a chunk going to the upstream (`request`) or back.
    fn decide(&self, request: bool) -> Fault {
        let (reset, hang) = match self.mode() {
            Mode::HangAll => (0.0, 1.0),
            Mode::ResetAll | Mode::Refuse => (1.0, 0.0),
            Mode::Calm => return Fault::None,
            Mode::Normal if request => (self.rates.reset_before, self.rates.hang_before),
            Mode::Normal => (self.rates.reset_after, self.rates.hang_after),
        };
        let roll = self.rng.lock().unwrap().f64();
        let counters = &self.counters;
        if roll < reset + hang {
            self.fault_times
                .lock()
                .unwrap()
                .push(std::time::Instant::now());
        }
        if roll < reset {
            let counter = if request {
                &counters.reset_before
            } else {
                &counters.reset_after
            };
            counter.fetch_add(1, Ordering::Relaxed);
            Fault::Reset
        } else if roll < reset + hang {
            let counter = if request {
                &counters.hang_before
            } else {
                &counters.hang_after
            };
            counter.fetch_add(1, Ordering::Relaxed);
            Fault::Hang
        } else {
            Fault::None
        }
    }
}

/// Close with an RST instead of a FIN.
fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

async fn pump(mut client: TcpStream, shared: Arc<Shared>) {
    let Ok(mut upstream) = TcpStream::connect(shared.target).await else {
        reset(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let mut chunks = 0u32;
    let mut from_client = vec![0u8; 16 * 1024];
    let mut from_upstream = vec![0u8; 16 * 1024];
    loop {
        let (request, read) = tokio::select! {
            read = client.read(&mut from_client) => (true, read),
            read = upstream.read(&mut from_upstream) => (false, read),
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        chunks += 1;
        let fault = if chunks <= shared.rates.grace_chunks {
            Fault::None
        } else {
            shared.decide(request)
        };
        match fault {
            Fault::None => {
                let written = if request {
                    upstream.write_all(&from_client[..n]).await
                } else {
                    client.write_all(&from_upstream[..n]).await
                };
                if written.is_err() {
                    reset(upstream);
                    return reset(client);
                }
            }
            Fault::Reset => {
                reset(upstream);
                return reset(client);
            }
            Fault::Hang => {
                drop(upstream);
                return hang(client).await;
            }
        }
    }
}

/// Keep the connection open, answering nothing, until the gateway closes it.
async fn hang(mut client: TcpStream) {
    let mut sink = vec![0u8; 16 * 1024];
    while let Ok(n) = client.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}
