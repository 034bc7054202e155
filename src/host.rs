//! What the host offers the process: its cores. Both the configuration
//! (`server_threads` when unset) and the store (the cap on Redis lanes)
//! read it, so it belongs to neither.

/// The cores this process may run on: `server_threads` when unset, and
/// the cap on Redis lanes.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}
