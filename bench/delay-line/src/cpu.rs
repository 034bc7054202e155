//! The CPU time this process used (user + system), from
//! `/proc/self/stat`, printed every so often.

use std::time::Duration;

/// Clock ticks per second of `/proc` times (`getconf CLK_TCK`: 100 on
/// Linux everywhere that matters).
const TICKS: f64 = 100.0;

/// User + system CPU seconds used so far, if `/proc` tells.
pub fn used() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: the fields start after its ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    Some((user + system) / TICKS)
}

/// Print `cpu <seconds>` on stdout every `every`.
pub fn report_every(every: Duration) {
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(every);
            if let Some(seconds) = used() {
                println!("cpu {seconds:.2}");
            }
        }
    });
}
