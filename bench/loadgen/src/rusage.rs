//! The generator's own cost, from `getrusage(RUSAGE_SELF)`: CPU time
//! (user and system, to the microsecond) and peak resident memory. A
//! benchmark reads them to tell whether the generator itself was the limit.

use std::ffi::{c_int, c_long};
use std::time::Duration;

/// `struct timeval` (64-bit Linux).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Timeval {
    sec: c_long,
    usec: c_long,
}

/// `struct rusage`: two timevals, then fourteen longs (`ru_maxrss` first).
#[repr(C)]
#[derive(Default)]
struct Rusage {
    user: Timeval,
    system: Timeval,
    rest: [c_long; 14],
}

unsafe extern "C" {
    fn getrusage(who: c_int, usage: *mut Rusage) -> c_int;
}

/// What the process used so far.
#[derive(Debug, Clone, Copy)]
pub struct Used {
    /// User + system CPU time.
    pub cpu: Duration,
    /// Peak resident set, KiB.
    pub max_rss_kib: u64,
}

/// This process's CPU time and peak memory, if the kernel tells.
pub fn used() -> Option<Used> {
    let mut usage = Rusage::default();
    // SAFETY: getrusage writes one struct rusage, which `Rusage` lays out
    // (repr(C), the Linux field order), into memory we own.
    if unsafe { getrusage(0, &mut usage) } != 0 {
        return None;
    }
    let time = |t: Timeval| {
        Duration::from_secs(t.sec.max(0) as u64) + Duration::from_micros(t.usec.max(0) as u64)
    };
    Some(Used {
        cpu: time(usage.user) + time(usage.system),
        max_rss_kib: usage.rest[0].max(0) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        // Spin until 30 ms of CPU time are counted (on a busy machine that
        // takes longer than 30 ms); a figure that never grows fails at 5 s.
        let before = used().unwrap();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while used().unwrap().cpu < before.cpu + Duration::from_millis(30)
            && start.elapsed() < Duration::from_secs(5)
        {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        let after = used().unwrap();
        assert!(
            after.cpu >= before.cpu + Duration::from_millis(30),
            "{before:?} {after:?}"
        );
        assert!(after.max_rss_kib > 100, "{after:?}");
    }
}
