//! Serving on one runtime per core (`server_threads`): each serving thread
//! runs a current-thread tokio runtime of its own, and a client connection,
//! once accepted, lives on one of them for good — its requests, the forward
//! tasks they spawn and the upstream connections they use (each thread has
//! its own upstream pool, [`current`] picks it). Nothing of a request then
//! moves between threads, except the store operations that have no lane
//! of the thread's own: a store opens its connections on the process's
//! shared runtime, whoever asks, and they stay there with the admin
//! listener and the background tasks, but each serving thread also gets a
//! Redis lane (one Redis server) or a PostgreSQL batcher and pool of its
//! own for its requests' claims and completions
//! (`StoreAdmin::open_serving_thread`).
//!
//! Why: on the shared multi-threaded runtime a pass-through request woke
//! another thread about every other request (a task stolen, or the
//! upstream connection's task running on the other worker), a `futex` and a
//! cold cache each time; measured on two shared cores, serving threads gave
//! pass-through 1.2× (30.0 → 26.9 µs of CPU a request) and left replays
//! equal, but new keys, whose store operations now always cross between a
//! serving thread and the store's runtime, lost 8–13 %
//! (`bench/results/2026-11-25.md`); `server_threads = 0` keeps the shared
//! runtime.
//!
//! One accept loop, on the shared runtime, keeps `max_connections` and
//! graceful shutdown exactly as before; it hands each accepted socket to the
//! thread with the fewest open connections (ties go round-robin), so
//! threads stay even whatever the clients' addresses. (`SO_REUSEPORT`
//! listeners would spread connections by a hash of the peer's address, and
//! would let a second process on the same port silently take half the
//! traffic.)

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

thread_local! {
    /// This thread's index among the serving threads (`None` elsewhere).
    static SERVING_THREAD: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The serving thread this code runs on (`None` on any other thread): the
/// index of its per-thread resources, such as its upstream pool.
pub(crate) fn current() -> Option<usize> {
    SERVING_THREAD.with(Cell::get)
}

/// The serving threads.
pub(crate) struct ServingThreads {
    threads: Vec<ServingThread>,
    /// Where the next tie goes.
    next: AtomicUsize,
    /// Cancelled: the threads drop their runtimes and end.
    release: CancellationToken,
}

struct ServingThread {
    handle: Handle,
    /// Connections placed on it and not yet ended.
    open: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl ServingThreads {
    /// Start `n` serving threads (n ≥ 1), each with its runtime.
    pub(crate) fn start(n: usize) -> std::io::Result<Self> {
        let release = CancellationToken::new();
        let mut threads = Vec::with_capacity(n);
        for index in 0..n {
            // The runtime is built (and dropped) on its own thread, never
            // inside the caller's runtime; its handle comes back.
            let (handle_tx, handle_rx) = std::sync::mpsc::sync_channel(1);
            let released = release.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("idemgate-serve-{index}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(error) => return drop(handle_tx.send(Err(error))),
                    };
                    SERVING_THREAD.with(|core| core.set(Some(index)));
                    crate::store::runtime::enter_serving_thread();
                    let _ = handle_tx.send(Ok(runtime.handle().clone()));
                    runtime.block_on(released.cancelled());
                    // What is left (connections past the shutdown deadline)
                    // is dropped; nothing is waited for.
                    runtime.shutdown_background();
                });
            let started = spawned.and_then(|thread| {
                let handle = handle_rx
                    .recv()
                    .map_err(|_| std::io::Error::other("a serving thread ended at start"))??;
                Ok((thread, handle))
            });
            let (thread, handle) = match started {
                Ok(started) => started,
                Err(error) => {
                    release.cancel();
                    return Err(error);
                }
            };
            threads.push(ServingThread {
                handle,
                open: Arc::new(AtomicUsize::new(0)),
                thread: Some(thread),
            });
        }
        Ok(Self {
            threads,
            next: AtomicUsize::new(0),
            release,
        })
    }

    /// Serve an accepted connection on the thread with the fewest open
    /// ones: the socket leaves this runtime's reactor and joins that
    /// thread's, and `serve` runs there until the connection ends.
    pub(crate) fn place<S, F>(&self, stream: TcpStream, serve: S) -> std::io::Result<()>
    where
        S: FnOnce(TcpStream) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let stream = stream.into_std()?;
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.threads.len();
        let core = (0..n)
            .map(|i| &self.threads[(start + i) % n])
            .min_by_key(|core| core.open.load(Ordering::Relaxed))
            .expect("at least one serving thread");
        let open = core.open.clone();
        open.fetch_add(1, Ordering::Relaxed);
        let placed = OpenGuard(open);
        core.handle.spawn(async move {
            let _placed = placed;
            match TcpStream::from_std(stream) {
                Ok(stream) => serve(stream).await,
                Err(error) => {
                    tracing::warn!(%error, "cannot move a connection to its serving thread")
                }
            }
        });
        Ok(())
    }

    /// Run `work` on every serving thread at once; wait for all of them.
    pub(crate) async fn on_each<W, F>(&self, work: W)
    where
        W: Fn() -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let runs: Vec<_> = self
            .threads
            .iter()
            .map(|core| core.handle.spawn(work()))
            .collect();
        for run in runs {
            let _ = run.await;
        }
    }

    /// End the threads, dropping whatever they still serve (called once
    /// connections and forwards are drained, or the shutdown deadline
    /// passed); waits for them.
    pub(crate) async fn stop(mut self) {
        self.release.cancel();
        let threads: Vec<_> = self
            .threads
            .iter_mut()
            .filter_map(|core| core.thread.take())
            .collect();
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

impl Drop for ServingThreads {
    /// Dropped without [`ServingThreads::stop`] (the serving future was dropped):
    /// the threads end on their own, dropping whatever they still serve.
    fn drop(&mut self) {
        self.release.cancel();
    }
}

/// Counts a placed connection as open until its task ends or is dropped.
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Place one connection whose task reports `(n, thread index, thread
    /// name)` and then lives until `end` is sent or dropped.
    async fn place_one(
        threads: &ServingThreads,
        listener: &tokio::net::TcpListener,
        n: usize,
        seen: &tokio::sync::mpsc::UnboundedSender<(usize, usize, Option<String>)>,
    ) -> (TcpStream, Option<tokio::sync::oneshot::Sender<()>>) {
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let (end, ended) = tokio::sync::oneshot::channel::<()>();
        let seen = seen.clone();
        threads
            .place(stream, move |_stream| async move {
                let name = std::thread::current().name().map(str::to_owned);
                seen.send((n, current().expect("a serving thread"), name))
                    .unwrap();
                let _ = ended.await;
            })
            .unwrap();
        (client, Some(end))
    }

    /// Connections go to the thread with the fewest open ones and run
    /// there (each sees its own thread's index); one that ends frees its
    /// place; `stop` ends the threads.
    #[tokio::test]
    async fn connections_go_to_the_least_busy_thread_and_stay_there() {
        let threads = ServingThreads::start(2).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (seen, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut open = Vec::new();
        for n in 0..4 {
            open.push(place_one(&threads, &listener, n, &seen).await);
        }
        let mut on = [Vec::new(), Vec::new()];
        for _ in 0..4 {
            let (n, index, name) = seen_rx.recv().await.unwrap();
            assert_eq!(name, Some(format!("idemgate-serve-{index}")));
            on[index].push(n);
        }
        assert_eq!((on[0].len(), on[1].len()), (2, 2), "{on:?}");
        // Thread 0's two connections end: the next two both go there.
        for &n in &on[0] {
            let _ = open[n].1.take().expect("not ended yet").send(());
        }
        let freed = async {
            while threads.threads[0].open.load(Ordering::Relaxed) > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), freed)
            .await
            .expect("ended connections free their place");
        for n in 4..6 {
            open.push(place_one(&threads, &listener, n, &seen).await);
            let (_, index, _) = seen_rx.recv().await.unwrap();
            assert_eq!(index, 0, "connection {n} went to the busier thread");
        }
        tokio::time::timeout(Duration::from_secs(10), threads.stop())
            .await
            .expect("released threads end, dropping what they still serve");
    }

    /// `on_each` runs its work once on every serving thread, and returns
    /// when all have run it.
    #[tokio::test]
    async fn on_each_runs_on_every_thread() {
        let threads = ServingThreads::start(3).unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        threads
            .on_each(|| {
                let seen = seen.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let serving = crate::store::runtime::on_serving_thread();
                    seen.lock().unwrap().push((current(), serving));
                }
            })
            .await;
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_unstable();
        assert_eq!(seen, [(Some(0), true), (Some(1), true), (Some(2), true)]);
        threads.stop().await;
    }

    /// Off the serving threads, [`current`] is `None` (their own pool).
    #[test]
    fn other_threads_are_no_serving_thread() {
        assert_eq!(std::thread::spawn(current).join().unwrap(), None);
    }
}
