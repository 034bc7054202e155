//! The SQLite store's writer: one task per process owns the write
//! connection and commits the operations queued meanwhile together (group
//! commit). SQLite runs one write transaction at a time and each commit
//! costs an `fsync`; one commit for every operation that arrived while the
//! last one was on disk multiplies the write rate under load and adds
//! nothing at low load (a batch of one starts at once).
//!
//! - A batch is one `BEGIN IMMEDIATE` transaction (the file's write lock
//!   from its first statement); each operation runs inside a savepoint of
//!   its own, so one operation's failure is rolled back alone and never
//!   fails its neighbours. Operations run in arrival order: duplicates of
//!   one key inside a batch resolve as if sequential.
//! - Nobody is answered before the batch's `COMMIT` returns: a claim or a
//!   record is on disk when its caller hears of it. If the commit fails,
//!   every operation of the batch fails.
//! - A batch holds at most [`MAX_OPS`] operations and [`MAX_BYTES`] of
//!   response bodies; the queue holds [`QUEUE`] operations (callers wait for
//!   room, within `[store] timeout`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::Connection;
use sqlx::sqlite::SqliteConnection;
use tokio::sync::{mpsc, oneshot};

use super::ops::{Op, Reply, execute};
use crate::StoreError;
use crate::batch_queue::take_batch;

/// Most operations in one transaction.
const MAX_OPS: usize = 256;
/// Most bytes of response bodies in one transaction.
const MAX_BYTES: usize = 8 << 20;
/// Most operations queued for the writer.
const QUEUE: usize = 4096;

/// One queued operation and where its answer goes.
struct Job {
    op: Op,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// The handle of the writer task (cheap to clone: shared).
#[derive(Debug, Clone)]
pub(super) struct Writer {
    jobs: mpsc::Sender<Job>,
    /// Transactions committed so far (read by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    commits: Arc<AtomicU64>,
    /// Asks the task (once) to checkpoint and close its connection; it
    /// answers on the sender it is given once it has.
    close: Arc<Mutex<Option<oneshot::Sender<oneshot::Sender<()>>>>>,
}

impl Writer {
    /// Start the writer task on `conn`; it ends when every handle is dropped.
    pub(super) fn start(conn: SqliteConnection, context: super::rows::Context) -> Self {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let commits = Arc::new(AtomicU64::new(0));
        let (close, closing) = oneshot::channel();
        tokio::spawn(run(conn, queue, closing, context, commits.clone()));
        Self {
            jobs,
            commits,
            close: Arc::new(Mutex::new(Some(close))),
        }
    }

    /// Stop writing: the task commits every operation already queued,
    /// checkpoints the write-ahead log into the database file and closes
    /// its connection. Operations submitted later fail as "stopped".
    /// Returns once done.
    pub(super) async fn close(&self) {
        let ask = self.close.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(ask) = ask else { return };
        let (done, closed) = oneshot::channel();
        if ask.send(done).is_ok() {
            let _ = closed.await;
        }
    }

    /// Transactions committed so far (each carries one or more operations).
    #[cfg(test)]
    pub(super) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Queue `op` and wait for its committed answer (the caller bounds the
    /// wait: an operation whose caller left may still be committed).
    pub(super) async fn submit(&self, op: Op) -> Result<Reply, StoreError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the SQLite writer has stopped".into());
        self.jobs
            .send(Job { op, reply })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(
    mut conn: SqliteConnection,
    mut queue: mpsc::Receiver<Job>,
    mut closing: oneshot::Receiver<oneshot::Sender<()>>,
    context: super::rows::Context,
    commits: Arc<AtomicU64>,
) {
    let mut next: Option<Job> = None;
    // Until every handle is gone, or one asks to close.
    let mut may_close = true;
    // Asked to close: the queue takes no more jobs, those in it are still
    // committed, then the connection closes and the asker hears of it.
    let mut closed: Option<oneshot::Sender<()>> = None;
    loop {
        let first = match next.take() {
            Some(job) => job,
            None => tokio::select! {
                job = queue.recv() => match job {
                    Some(job) => job,
                    None => {
                        if let Some(done) = closed {
                            checkpoint_and_close(conn).await;
                            let _ = done.send(());
                        }
                        return;
                    }
                },
                asked = &mut closing, if may_close => {
                    may_close = false;
                    if let Ok(done) = asked {
                        queue.close();
                        closed = Some(done);
                    }
                    continue;
                },
            },
        };
        let (batch, rest) = take_batch(&mut queue, first, MAX_OPS, MAX_BYTES, |job| {
            job.op.body_bytes()
        });
        next = rest;
        if commit_batch(&mut conn, batch, &context).await {
            commits.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A graceful stop: copy what the log holds into the database file, then
/// close. The checkpoint is passive (it takes no lock and waits for no
/// one, so other processes sharing the file are never held up); when the
/// last connection to the file closes, SQLite checkpoints the rest and
/// removes the `-wal` and `-shm` files. A failure only leaves the log for
/// the next open to replay, so it is logged at debug.
async fn checkpoint_and_close(mut conn: SqliteConnection) {
    let checkpoint = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
        .execute(&mut conn)
        .await;
    if let Err(error) = checkpoint {
        tracing::debug!(%error, "SQLite checkpoint at close failed; the next open replays the log");
    }
    if let Err(error) = conn.close().await {
        tracing::debug!(%error, "closing the SQLite writer's connection failed");
    }
}

/// Run `batch` in one transaction, then answer every caller; whether it
/// committed.
async fn commit_batch(
    conn: &mut SqliteConnection,
    batch: Vec<Job>,
    context: &super::rows::Context,
) -> bool {
    let failed = |e: sqlx::Error| format!("the SQLite write transaction failed: {e}");
    let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(e) => {
            let error = failed(e);
            for job in batch {
                let _ = job.reply.send(Err(StoreError::Unavailable(error.clone())));
            }
            return false;
        }
    };
    let mut answers = Vec::with_capacity(batch.len());
    for job in batch {
        let answer = in_savepoint(&mut tx, &job.op, context).await;
        answers.push((job.reply, answer));
    }
    match tx.commit().await {
        Ok(()) => {
            for (reply, answer) in answers {
                let _ = reply.send(answer);
            }
            true
        }
        Err(e) => {
            let error = failed(e);
            for (reply, _) in answers {
                let _ = reply.send(Err(StoreError::Unavailable(error.clone())));
            }
            false
        }
    }
}

/// `op` inside a savepoint: kept if it succeeds, rolled back alone if not.
async fn in_savepoint(
    conn: &mut SqliteConnection,
    op: &Op,
    context: &super::rows::Context,
) -> Result<Reply, StoreError> {
    let unavailable = |e: sqlx::Error| StoreError::Unavailable(e.to_string());
    let mut savepoint = conn.begin().await.map_err(unavailable)?;
    let answer = execute(&mut savepoint, op, context).await;
    match &answer {
        Ok(_) => savepoint.commit().await.map_err(unavailable)?,
        Err(_) => savepoint.rollback().await.map_err(unavailable)?,
    }
    answer
}
