//! What a webhook receiver sends back: the answer head (status line,
//! headers, framing) and a chunked body's framing. None may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dispatcher::parse_answer_for_fuzzing(data);
});
