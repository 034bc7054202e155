//! Reloading when the config file changes (`watch_config`): the file is
//! read every interval and reloaded when its bytes differ both from the
//! configuration in force and from the last ones seen. Reading the path
//! whole each time follows a Kubernetes ConfigMap's symlink swap, which
//! leaves no single file's modification time to watch. A change that is
//! refused is not tried again until the file changes again; a file that
//! cannot be read (a swap in progress) is skipped until the next look.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::Reloader;

/// Look at the config file every `every`, forever, and reload on a
/// change. Nothing to do for a configuration that came from no file.
pub(crate) async fn watch(reloader: Arc<Reloader>, every: Duration) {
    let Some(source) = reloader.current().source.clone() else {
        return;
    };
    let mut seen = source.digest;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Ok(bytes) = tokio::fs::read(&source.path).await else {
            continue;
        };
        let now: [u8; 32] = Sha256::digest(&bytes).into();
        let in_force = reloader.current().source.as_ref().map(|s| s.digest);
        if now != seen && Some(now) != in_force {
            let _ = reloader.reload("file change").await;
        }
        seen = now;
    }
}
