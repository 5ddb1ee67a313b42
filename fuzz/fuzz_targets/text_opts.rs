#![no_main]
//! Fuzzes the `ibacm_opts.cfg` parser: never panics, counts add up, errors come in line order,
//! and every applied value stays inside its documented range.
use acm_core_nostd::text::opts::{OptionLines, ProviderOptions, MAX_CAPACITY, PATH_MAX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut last_line = 0u32;
    let (o, stats) = ProviderOptions::load(data, |e| {
        assert!(e.line > last_line, "errors out of order");
        last_line = e.line;
        assert!(!e.reason().is_empty());
    });
    assert_eq!(
        stats.options,
        stats.applied + stats.ignored + stats.unknown + stats.errors
    );
    assert_eq!(stats.options as usize, OptionLines::new(data).count());
    assert!(matches!(o.min_mtu, 256 | 512 | 1024 | 2048 | 4096));
    assert!(o.route_data_file.len() <= PATH_MAX && o.addr_data_file.len() <= PATH_MAX);
    assert!(o.acmrs_path_capacity >= 1 && o.acmrs_path_capacity <= MAX_CAPACITY);
    assert!(o.acmrs_refresh_ahead_pct <= 99);
    assert!(o.log_level <= 2 && o.acmrs_log_level.is_none_or(|l| l <= 4));
    assert!(o.acmrs_cpu >= -1);
    // Applying the same file again over the result changes nothing (every line is idempotent).
    let mut again = o.clone();
    again.update_from(data, |_| {});
    assert_eq!(again, o);
});
