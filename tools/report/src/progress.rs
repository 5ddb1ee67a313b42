//! [`progress`]: one line per phase of a long run on stderr, timed from the start of the run,
//! a measuring child's lines on its parent's clock.

use std::time::{Duration, Instant};

/// The environment variable that carries [`progress`]'s start time (Unix time in µs) to child
/// processes, so a measuring child's lines continue the parent's clock.
pub const PROGRESS_EPOCH_ENV: &str = "ACM_BENCH_PROGRESS_EPOCH_US";

fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// When [`progress`] started counting, as `(Instant, Unix µs)`: the first call in the process,
/// or the parent's start from [`PROGRESS_EPOCH_ENV`].
fn progress_start() -> (Instant, u64) {
    static START: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        let (now, now_us) = (Instant::now(), unix_us());
        let parent = std::env::var(PROGRESS_EPOCH_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&us| us <= now_us);
        match parent {
            Some(us) => (
                now.checked_sub(Duration::from_micros(now_us - us))
                    .unwrap_or(now),
                us,
            ),
            None => (now, now_us),
        }
    })
}

/// Prints one progress line on stderr, `[  12.3 s] text`, timed from the first call in the
/// process (or from the parent's, see [`progress_env`]). Long runs call it at the start of
/// each phase, so they show where they are.
pub fn progress(text: impl std::fmt::Display) {
    let t = progress_start().0.elapsed();
    eprintln!("[{:7.1} s] {text}", t.as_secs_f64());
}

/// `(name, value)` of the environment variable to give a child process so that its
/// [`progress`] lines use this process's clock.
pub fn progress_env() -> (&'static str, String) {
    (PROGRESS_EPOCH_ENV, progress_start().1.to_string())
}
