//! The environment parser: arbitrary `KEY=VALUE` lines never panic, and
//! every refusal names a variable.
#![no_main]

// The service's own parser, from the binary crate (which has no library).
#[path = "../../control-plane/src/config.rs"]
#[allow(dead_code)]
mod config;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let vars: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            // Steer most keys into the namespace the parser reads.
            let k = if k.starts_with("CONTROLPLANE_") || k.is_empty() {
                k.to_string()
            } else {
                format!("CONTROLPLANE_{}", k.to_ascii_uppercase())
            };
            (k, v.to_string())
        })
        .collect();
    match config::Config::from_vars(vars) {
        Ok(c) => {
            let _ = format!("{c:?}");
        }
        Err(e) => assert!(e.variable.starts_with("CONTROLPLANE_"), "{e}"),
    }
});
