//! Linux lets a sleeping thread wake up to its "timer slack" late (50 µs
//! by default), so that wakeups can be grouped. Two sleeps per round trip
//! would add ~0.1 ms to every delay; the line asks for 1 µs instead
//! (`prctl(PR_SET_TIMERSLACK)`), before it starts a thread, since threads
//! inherit it.

/// `PR_SET_TIMERSLACK` from `<linux/prctl.h>`.
const PR_SET_TIMERSLACK: i32 = 29;

unsafe extern "C" {
    fn prctl(option: i32, ...) -> i32;
}

/// Ask for a 1 µs timer slack for this thread and those it starts; on a
/// kernel that refuses, say so and go on with the default.
pub fn tighten() {
    // SAFETY: PR_SET_TIMERSLACK takes one unsigned long and touches no
    // memory of ours.
    let result = unsafe { prctl(PR_SET_TIMERSLACK, 1000 as std::ffi::c_ulong) };
    if result != 0 {
        eprintln!("delay-line: cannot tighten the timer slack; delays may run ~50 µs long");
    }
}
