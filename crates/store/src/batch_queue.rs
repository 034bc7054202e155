//! Taking one batch off a queue of store operations, as the group-commit
//! writers do (crates/store/src/sqlite/writer.rs, crates/store/src/postgres/batch.rs):
//! the first operation, then whatever else is queued already, up to a
//! count and a byte bound. Nothing waits for more to arrive: a lone
//! operation makes a batch of one at once.

use tokio::sync::mpsc;

/// `first` and the operations queued behind it, at most `max_ops` of them
/// and at most `max_bytes` by `bytes` (the first always goes, however
/// large). Returns the batch and the operation that did not fit, if one
/// was taken off the queue: it starts the next batch.
pub(crate) fn take_batch<T>(
    queue: &mut mpsc::Receiver<T>,
    first: T,
    max_ops: usize,
    max_bytes: usize,
    bytes: impl Fn(&T) -> usize,
) -> (Vec<T>, Option<T>) {
    let mut total = bytes(&first);
    let mut batch = vec![first];
    while batch.len() < max_ops {
        let Ok(op) = queue.try_recv() else { break };
        total += bytes(&op);
        if total > max_bytes {
            return (batch, Some(op));
        }
        batch.push(op);
    }
    (batch, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn batches_stop_at_the_count_and_the_byte_bound() {
        let (tx, mut rx) = mpsc::channel(16);
        for n in [1, 2, 3, 4, 5] {
            tx.send(n).await.unwrap();
        }
        let (batch, next) = take_batch(&mut rx, 10, 3, 100, |n| *n);
        assert_eq!((batch, next), (vec![10, 1, 2], None));
        // 3 + 4 fit in 8 bytes; 5 does not and starts the next batch.
        let (batch, next) = take_batch(&mut rx, 0, 10, 8, |n| *n);
        assert_eq!((batch, next), (vec![0, 3, 4], Some(5)));
        // A first operation over the bound still goes, alone.
        let (batch, next) = take_batch(&mut rx, 50, 10, 8, |n| *n);
        assert_eq!((batch, next), (vec![50], None));
    }
}
