//! Datagram transport between simulated HCAs, and the loss/delay/duplication/reorder knobs.

use std::fmt;
use std::sync::Mutex;

/// Fault-injection knobs applied to every datagram sent by this process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Knobs {
    /// Probability that a datagram is silently lost.
    pub loss: f64,
    /// Probability that a datagram is delivered twice.
    pub dup: f64,
    /// Probability that a datagram is held back and sent after the next one.
    pub reorder: f64,
    /// Delay added before each datagram is sent, in milliseconds.
    pub delay_ms: u64,
}

impl fmt::Display for Knobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loss={} dup={} reorder={} delay_ms={}",
            self.loss, self.dup, self.reorder, self.delay_ms
        )
    }
}

fn knob_cell() -> &'static Mutex<Knobs> {
    static K: std::sync::OnceLock<Mutex<Knobs>> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let mut k = Knobs::default();
        for (env, name) in [
            ("SIMVERBS_LOSS", "loss"),
            ("SIMVERBS_DUP", "dup"),
            ("SIMVERBS_REORDER", "reorder"),
            ("SIMVERBS_DELAY_MS", "delay_ms"),
        ] {
            if let Ok(v) = std::env::var(env) {
                if let Err(e) = apply(&mut k, name, &v) {
                    crate::log(format_args!("ignoring {env}: {e}"));
                }
            }
        }
        Mutex::new(k)
    })
}

/// The current knobs.
pub fn knobs() -> Knobs {
    knob_cell().lock().map(|k| *k).unwrap_or_default()
}

fn apply(k: &mut Knobs, name: &str, value: &str) -> Result<(), String> {
    let prob = |v: &str| -> Result<f64, String> {
        match v.parse::<f64>() {
            Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
            _ => Err(format!("'{v}' is not a probability in 0..1")),
        }
    };
    match name {
        "loss" => k.loss = prob(value)?,
        "dup" => k.dup = prob(value)?,
        "reorder" => k.reorder = prob(value)?,
        "delay_ms" => {
            k.delay_ms = value
                .parse::<u64>()
                .ok()
                .filter(|d| *d <= 60_000)
                .ok_or_else(|| format!("'{value}' is not a delay in 0..60000 ms"))?
        }
        _ => return Err(format!("unknown knob '{name}'")),
    }
    Ok(())
}

/// Sets one knob by name (`loss`, `dup`, `reorder`, `delay_ms`).
pub fn set_knob(name: &str, value: &str) -> Result<(), String> {
    let mut k = knob_cell()
        .lock()
        .map_err(|_| "knob lock poisoned".to_string())?;
    apply(&mut k, name, value)
}
