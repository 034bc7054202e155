//! What the host offers the process: its cores, which `server_threads`
//! defaults to. (The store crate caps its Redis lanes by the same count,
//! asking the standard library itself.)

/// The cores this process may run on: `server_threads` when unset.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}
