//! Parses the `ibacm_opts.cfg` template that the real `ib_acme -O` writes: every option in it
//! must be known (applied or deliberately ignored) and equal our defaults.

use acm_core_nostd::text::opts::{ProviderOptions, MAX_LINE};
use std::path::PathBuf;
use std::process::Command;

/// A scratch directory removed on drop (also when the test fails).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("acmrs-text-opts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn ib_acme_template_is_fully_understood() {
    let scratch = Scratch::new();
    let out = Command::new("ib_acme")
        .arg("-O")
        .arg("-D")
        .arg(&scratch.0)
        .output()
        .expect("ib_acme not found: install the Debian package `ibacm`");
    assert!(out.status.success(), "ib_acme -O failed: {out:?}");
    let text = std::fs::read(scratch.0.join("ibacm_opts.cfg")).expect("template written");

    let mut errors = Vec::new();
    let (opts, stats) = ProviderOptions::load(&text, |e| errors.push(e));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        stats.unknown, 0,
        "an option of the template is not recognized"
    );
    assert_eq!(stats.errors, 0);
    // rdma-core 44's template has 22 settings: 16 we use (all of ibacmp's that it lists, plus
    // the core's timeout, retries, sa_depth and log_level) and 6 core-only ones we ignore.
    assert_eq!(stats.applied + stats.ignored, stats.options);
    assert!(stats.applied >= 16, "{stats:?}");
    // The template writes the defaults, and ours are the same.
    assert_eq!(opts, ProviderOptions::default());

    // No template line is so long that ibacm's 120-byte fgets would split it.
    for line in text.split(|&b| b == b'\n') {
        assert!(line.len() <= MAX_LINE || line.first() == Some(&b'#'));
    }
}
